import pytest
import torch
from transformers import AutoModelForCausalLM

from selective_rollout.config.trainer import LoraConfig, TrainerConfig
from selective_rollout.trainer.modeling import adapter_weights, load_policy, merged_weights


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


def test_adapter_export_holds_only_lora_tensors(tiny_model_dir):
    model = load_policy(tiny_model_dir, TrainerConfig(lora=LoraConfig(enabled=True, sync="adapter")))
    names = [n for n, _ in adapter_weights(model)]
    assert names and all("lora_A" in n or "lora_B" in n for n in names)


def test_missing_model_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load_policy(tmp_path, TrainerConfig())


def test_adapter_sync_without_lora_is_a_config_error():
    with pytest.raises(ValueError, match=r"lora\.sync=adapter needs trainer\.lora\.enabled"):
        TrainerConfig(lora=LoraConfig(sync="adapter"))
