"""Model alias resolution: the wheel's GGUF becomes a cached safetensors folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from selective_rollout import models
from selective_rollout.models import ModelResolutionError, resolve_model


def test_alias_resolves_to_a_loadable_cached_folder(smollm2_path: Path):
    assert (smollm2_path / "config.json").is_file()
    assert (smollm2_path / "model.safetensors").is_file()
    assert (smollm2_path / "tokenizer.json").is_file()
    before = os.stat(smollm2_path / "model.safetensors").st_mtime_ns
    again = resolve_model("SmolLM2-135M-Instruct")  # case-insensitive, served from the cache
    assert again == smollm2_path
    assert os.stat(again / "model.safetensors").st_mtime_ns == before


def test_converted_folder_keeps_the_chat_template(smollm2_tokenizer):
    text = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text
    assert smollm2_tokenizer.eos_token == "<|im_end|>"


def test_local_path_passes_through(smollm2_path: Path):
    assert resolve_model(str(smollm2_path)) == smollm2_path.resolve()


def _hub_cache(root: Path, repo_id: str) -> Path:
    """A tiny Llama saved where the Hugging Face hub client puts a download: models--org--name with
    refs/main naming a snapshot folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(snapshot)
    return snapshot


def test_hub_id_resolves_to_its_snapshot_in_the_local_cache(monkeypatch, tmp_path: Path):
    """What a 7B config names (org/name) must reach the learner as a folder it can load offline."""
    from selective_rollout.config.trainer import TrainerConfig
    from selective_rollout.learner.modeling import load_policy

    snapshot = _hub_cache(tmp_path, "tiny-org/tiny-llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve_model("tiny-org/tiny-llama")
    assert path == snapshot and (path / "config.json").is_file()
    assert load_policy(path, TrainerConfig()).config.hidden_size == 16


def test_hub_id_missing_offline_is_one_clear_error(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelResolutionError, match=r"'Qwen/Qwen2.5-7B-Instruct' is not in the Hugging Face cache"
    ):
        resolve_model("Qwen/Qwen2.5-7B-Instruct")


def test_a_name_with_more_than_one_slash_is_not_a_hub_id():
    with pytest.raises(ModelResolutionError, match="neither an alias"):
        resolve_model("a/b/c")


@pytest.mark.parametrize("bad", ["", "./no/such/model", "/no/such/model"])
def test_bad_names_are_one_clear_error(bad: str):
    with pytest.raises(ModelResolutionError, match="model"):
        resolve_model(bad)


def test_folder_without_config_is_rejected(tmp_path: Path):
    with pytest.raises(ModelResolutionError, match=r"config\.json"):
        resolve_model(str(tmp_path))


def test_alias_of_a_missing_package_says_how_to_install(monkeypatch, tmp_path: Path):
    fake = models.GGUFAlias(package="no_such_pkg_sr_test", filename="x.gguf", pip_hint="pip install nothing")
    monkeypatch.setitem(models.ALIASES, "fake-alias", fake)
    with pytest.raises(ModelResolutionError, match=r"no_such_pkg_sr_test.*pip install nothing"):
        resolve_model("fake-alias", cache_dir=tmp_path)


@pytest.mark.slow
def test_conversion_keeps_the_ggufs_logits(smollm2_path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    spec = models.ALIASES["smollm2-135m-instruct"]
    gguf = models._gguf_path("smollm2-135m-instruct", spec)
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(smollm2_path)).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356]])
    with torch.no_grad():
        assert torch.allclose(ref(ids).logits, ours(ids).logits, atol=1e-5)


def test_actors_get_an_alias_or_hub_id_to_resolve_on_their_node_and_a_folder_otherwise(smollm2_path: Path):
    from selective_rollout.models import model_for_actors

    assert model_for_actors("Qwen/Qwen2.5-7B-Instruct", Path("/driver/cache/x")) == "Qwen/Qwen2.5-7B-Instruct"
    assert model_for_actors("smollm2-135m-instruct", smollm2_path) == "smollm2-135m-instruct"
    assert model_for_actors("smollm2-135m-instruct", smollm2_path, "/shared/models") == str(smollm2_path)
    assert model_for_actors(str(smollm2_path), smollm2_path) == str(smollm2_path)


def test_an_actor_resolves_a_hub_id_in_its_own_nodes_cache(monkeypatch, tmp_path: Path):
    """The driver's snapshot path is not handed over: this node's cache has its own."""
    from selective_rollout.models import model_here

    snapshot = _hub_cache(tmp_path, "tiny-org/tiny-llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_here("tiny-org/tiny-llama") == snapshot


def test_a_model_missing_on_an_actors_node_is_one_line_naming_the_node(monkeypatch, tmp_path: Path):
    import socket

    from selective_rollout.models import model_here

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for model in (str(tmp_path / "warm-start-on-the-driver"), "tiny-org/absent"):
        with pytest.raises(ModelResolutionError) as raised:
            model_here(model)
        message = str(raised.value)
        assert message.startswith(f"node {socket.gethostname()}: ") and "\n" not in message
        assert "shares" in message
