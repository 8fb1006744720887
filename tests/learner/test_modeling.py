import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from selective_rollout.config.trainer import LoraConfig, TrainerConfig
from selective_rollout.learner.modeling import export_units, load_policy, merged_weights


def test_full_model_exports_hf_names(tiny_model_dir):
    model = load_policy(tiny_model_dir, TrainerConfig())
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert [n for n, _ in merged_weights(model)] == [n for n, _ in plain.named_parameters()]


def test_lora_merged_export_equals_peft_merge(tiny_model_dir):
    cfg = TrainerConfig(lora=LoraConfig(enabled=True, rank=4))
    model = load_policy(tiny_model_dir, cfg)
    with torch.no_grad():  # a trained-looking adapter: peft initialises lora_B to zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    before = {n: p.clone() for n, p in model.named_parameters()}
    exported = dict(merged_weights(model))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the learner is untouched
    reference = dict(model.merge_and_unload().named_parameters())
    assert list(exported) == list(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(exported[name], tensor)
    assert not torch.equal(
        exported["model.layers.0.self_attn.q_proj.weight"],
        before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
    )


def test_lora_export_of_a_model_with_biases_merges_weights_only_one_module_at_a_time(tmp_path):
    """Qwen2 (the 7B configs' model) has q/k/v biases under LoRA: the delta goes into the weight,
    the bias is exported as it is (adding the delta to it too was a shape error at the first
    sync); each export unit is one module, a LoRA layer with its adapters."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    model = load_policy(tmp_path, TrainerConfig(lora=LoraConfig(enabled=True, rank=4)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    module_of = {
        id(p): n.rpartition(".")[0].removesuffix(".base_layer").split(".lora_")[0]
        for n, p in model.named_parameters()
    }
    units = export_units(model)
    for unit in units:
        assert len({module_of[id(p)] for p in unit.params}) == 1
    q = "model.layers.0.self_attn.q_proj"
    (q_proj,) = [u for u in units if u.exports[0][0] == f"{q}.weight"]
    assert [n for n, _ in q_proj.exports] == [f"{q}.weight", f"{q}.bias"]
    assert len(q_proj.params) == 4  # base weight and bias, lora_A and lora_B
    exported = dict(merged_weights(model))
    reference = dict(model.merge_and_unload().named_parameters())
    assert list(exported) == list(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(exported[name], tensor)


def test_a_bf16_lora_merge_is_rounded_once(tiny_model_dir):
    """On a bf16 base the merged weight is W + scale * B @ A computed in fp32 and rounded once.

    The values make double rounding visible: W = 1 and a delta of 2^-8 + 2^-18. Rounded to bf16
    first (8 significant bits) the delta is 2^-8, and 1 + 2^-8 is a tie that rounds to 1; the
    exact sum is past the tie and rounds to 1 + 2^-7."""
    cfg = TrainerConfig(precision="bf16", lora=LoraConfig(enabled=True, rank=8, alpha=16.0))
    model = load_policy(tiny_model_dir, cfg)
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    assert q.scaling["default"] == 2.0
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight
    with torch.no_grad():
        q.base_layer.weight.fill_(1.0)
        a.zero_()
        a[0], a[1] = 2.0**-9, 2.0**-19  # every column of B @ A: 2^-9 + 2^-19, times 2
        b.zero_()
        b[:, :2] = 1.0
        delta = 2.0 * (b.float() @ a.float())
        once = (q.base_layer.weight.float() + delta).to(torch.bfloat16)
        twice = q.base_layer.weight + delta.to(torch.bfloat16)  # what peft's delta, added in bf16, gives
    assert torch.all(once == 1 + 2.0**-7) and torch.all(twice == 1.0)  # the case tells them apart
    merged = dict(merged_weights(model))["model.layers.0.self_attn.q_proj.weight"]
    assert merged.dtype == torch.bfloat16
    assert torch.equal(merged, once)


def test_a_bf16_lora_on_the_embedding_and_a_conv_is_merged_in_fp32(tiny_model_dir):
    """An embedding's adapters are laid out transposed (PEFT's ``lora_embedding_A/B``); a layer
    kind without a formula here (a convolution) adds PEFT's own delta, in fp32 too."""
    cfg = TrainerConfig(precision="bf16", lora=LoraConfig(enabled=True, target_modules=["embed_tokens"]))
    model = load_policy(tiny_model_dir, cfg)
    emb = model.base_model.model.model.embed_tokens
    torch.manual_seed(0)
    with torch.no_grad():
        a, b = emb.lora_embedding_A["default"], emb.lora_embedding_B["default"]
        a.normal_(0, 0.1)  # peft starts an embedding's A at zero
        b.normal_(0, 0.1)
        want = (emb.base_layer.weight.float() + emb.scaling["default"] * (b.float() @ a.float()).T).to(
            torch.bfloat16
        )
    assert torch.equal(dict(merged_weights(model))["model.embed_tokens.weight"], want)

    torch.manual_seed(0)
    conv = get_peft_model(_Conv(), PeftLoraConfig(target_modules=["conv"], init_lora_weights=False))
    (unit,) = [u for u in export_units(conv) if u.lora is not None]
    layer = unit.lora
    with torch.no_grad():
        want = (layer.base_layer.weight.float() + layer.get_delta_weight("default").float()).to(
            torch.bfloat16
        )
    assert torch.equal(dict(unit.weights())["conv.weight"], want)


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, dtype=torch.bfloat16)


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_policy_loads_in_the_training_precision(tiny_model_dir, precision, dtype):
    model = load_policy(tiny_model_dir, TrainerConfig(precision=precision))
    assert {p.dtype for p in model.parameters()} == {dtype}


def test_missing_model_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load_policy(tmp_path, TrainerConfig())


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_logprobs_equal_the_whole_softmax(tiny_model_dir, chunk):
    """Log-probs, entropy and their gradient do not depend on how the sequence is chunked."""
    from selective_rollout.learner.modeling import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0

    def reference():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, ids[:, 1:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)

    want, want_entropy = reference()
    model.zero_grad()
    want.sum().backward()
    want_grad = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got, got_entropy, _ = token_logprobs(model, ids, mask, with_entropy=True, chunk_tokens=chunk)
    got.sum().backward()
    torch.testing.assert_close(got, want.detach())
    torch.testing.assert_close(got_entropy, want_entropy.detach())
    for p, g in zip(model.parameters(), want_grad, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_logprobs_at_named_positions_equal_the_full_ones_there_and_zero_elsewhere(tiny_model_dir):
    """The vocabulary projection restricted to the policy tokens changes neither their log-probs,
    entropy nor the gradient of a masked loss; every other position reads 0."""
    from selective_rollout.learner.modeling import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    positions = torch.zeros((2, 11), dtype=torch.bool)
    positions[0, [3, 4, 8]] = True
    positions[1, [5, 6]] = True

    def masked_loss_and_grads(**kwargs):
        model.zero_grad()
        logp, entropy, _ = token_logprobs(model, ids, attention, with_entropy=True, chunk_tokens=4, **kwargs)
        (logp * positions).sum().backward()
        return logp.detach(), entropy, [p.grad.clone() for p in model.parameters()]

    full, full_entropy, full_grads = masked_loss_and_grads()
    some, some_entropy, some_grads = masked_loss_and_grads(positions=positions)
    columns = positions.any(0)
    torch.testing.assert_close(some[:, columns], full[:, columns])
    torch.testing.assert_close(some_entropy[:, columns], full_entropy[:, columns])
    assert (some[:, ~columns] == 0).all() and (some_entropy[:, ~columns] == 0).all()
    for got, want in zip(some_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want)
    none_named = token_logprobs(model, ids, attention, positions=torch.zeros_like(positions)).logprobs
    torch.testing.assert_close(none_named.detach(), full)
