"""The engine's attention and KV cache replacements compute exactly what transformers' own do."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from selective_rollout.rollout.engines import grouped_attention
from selective_rollout.rollout.engines.growing_cache import GrowingCache


def _config(attn: str) -> LlamaConfig:
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    cfg._attn_implementation = attn
    return cfg


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    reference = LlamaForCausalLM(_config("sdpa")).eval()
    grouped = LlamaForCausalLM(_config(grouped_attention.register())).eval()
    grouped.load_state_dict(reference.state_dict())
    assert grouped.model.layers[0].self_attn.config._attn_implementation == "grouped_sdpa"
    assert reference.model.layers[0].self_attn.config._attn_implementation == "sdpa"
    return reference, grouped


@torch.inference_mode()
def test_grouped_attention_equals_sdpa_with_left_padding(models, monkeypatch):
    reference, grouped = models
    calls = []
    real = grouped_attention.F.scaled_dot_product_attention
    # record the number of query heads each SDPA call sees: 6 in the reference, 2 (the KV heads,
    # queries folded in) on the grouped path
    monkeypatch.setattr(
        grouped_attention.F,
        "scaled_dot_product_attention",
        lambda q, *a, **k: calls.append(q.shape[1]) or real(q, *a, **k),
    )
    ids = torch.randint(0, 97, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5], mask[2, :11] = 0, 0  # left padding, as the engine's decode batch has
    a = reference(input_ids=ids, attention_mask=mask, use_cache=True)
    b = grouped(input_ids=ids, attention_mask=mask, use_cache=True)
    keep = mask.bool()
    assert torch.allclose(a.logits[keep], b.logits[keep], atol=1e-5)
    # one decode step on the cached prompt: query length 1 against the padded KV
    step = torch.randint(0, 97, (3, 1))
    mask2 = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
    a2 = reference(input_ids=step, attention_mask=mask2, past_key_values=a.past_key_values)
    b2 = grouped(input_ids=step, attention_mask=mask2, past_key_values=b.past_key_values)
    assert torch.allclose(a2.logits, b2.logits, atol=1e-5)
    assert calls.count(2) == 2 * 2 and calls.count(6) == 2 * 2  # 2 layers x (prefill, decode) each


@torch.inference_mode()
def test_growing_cache_decodes_like_the_dynamic_cache_past_its_capacity(models):
    _, model = models
    ids = torch.randint(0, 97, (2, 150))
    outs = {}
    for name, make in (("dynamic", DynamicCache), ("growing", GrowingCache)):
        prefix = model(input_ids=ids[:, :10], past_key_values=make(), use_cache=True)
        cache, logits = prefix.past_key_values, []
        for i in range(10, 150):  # 140 single-token appends: the buffer grows more than once
            out = model(input_ids=ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits)
        outs[name] = (torch.cat(logits, dim=1), cache)
    assert torch.equal(outs["dynamic"][0], outs["growing"][0])
    grown = outs["growing"][1].layers[0]
    assert grown.keys.shape[-2] == 150 and grown._k.shape[-2] >= 150
    assert torch.equal(grown.keys, outs["dynamic"][1].layers[0].keys)


@torch.inference_mode()
def test_growing_cache_starts_from_given_kv(models):
    _, model = models
    ids = torch.randint(0, 97, (1, 12))
    full = model(input_ids=ids, use_cache=True)
    kv = [(layer.keys, layer.values) for layer in full.past_key_values.layers]
    nxt = torch.randint(0, 97, (1, 1))
    a = model(input_ids=nxt, past_key_values=DynamicCache(ddp_cache_data=kv))
    b = model(input_ids=nxt, past_key_values=GrowingCache(kv))
    assert torch.equal(a.logits, b.logits)
