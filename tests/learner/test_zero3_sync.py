"""ZeRO-3 weight sync over real DeepSpeed learners (CPU, gloo): the broadcast gathers one module
at a time, never the whole model, and the engine still receives every weight (LoRA merged)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import ray
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from selective_rollout.config.trainer import LoraConfig, TrainerConfig
from selective_rollout.learner import LearnerGroup
from selective_rollout.learner.export import export_policy
from tests.learner.conftest import VOCAB, make_batch
from tests.learner.engine_double import EngineDouble

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Projections of 384 x 384 (147k elements): above ZeRO-3's persistence threshold (1e5), so
    DeepSpeed partitions them and keeps only the smaller tensors whole, as with a real model."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=384,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("wide_llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _watch_gathers(worker) -> list[str]:
    """Runs inside a learner: every ``GatheredParameters`` entered from now on records which of the
    partitioned parameters are whole at that moment. Returns the partitioned parameters' names."""
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    partitioned = [(n, p) for n, p in worker.module.named_parameters() if not p.ds_persist]
    worker.whole_at_gather = []
    real = deepspeed.zero.GatheredParameters

    class Watched(real):
        def __enter__(self):
            out = super().__enter__()
            whole = [n for n, p in partitioned if p.ds_status == ZeroParamStatus.AVAILABLE]
            worker.whole_at_gather.append(whole)
            return out

    deepspeed.zero.GatheredParameters = Watched
    return [n for n, _ in partitioned]


def _module_of(name: str) -> str:
    """The module a parameter belongs to; a LoRA layer's base layer counts as the layer."""
    return name.rpartition(".")[0].removesuffix(".base_layer")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_zero3_sync_gathers_one_module_at_a_time(
    ray_cluster, wide_model_dir, lora, smollm2_tokenizer, tmp_path_factory
):
    """... and a ZeRO-3 checkpoint exports (learner/export.py) to a model that scores as the learner."""
    cfg = TrainerConfig(
        lr=1e-2, num_learners=2, zero_stage=3, weight_sync="gloo", lora=LoraConfig(enabled=lora, rank=4)
    )
    group = LearnerGroup(cfg, wide_model_dir, seed=3)
    engine = ray.remote(EngineDouble).remote(str(wide_model_dir), blank=True)
    try:
        group.train_step(make_batch(5, {"a": [1.0, 0.0, 1.0], "b": [0.0, 1.0]}, turns=2))
        partitioned = ray.get([a.__ray_call__.remote(_watch_gathers) for a in group.actors])[0]
        modules = {_module_of(n) for n in partitioned}
        assert len(modules) >= 10  # q, o, gate, up, down of two layers: the test can tell
        group.sync_weights([engine], 1)
        for actor in group.actors:
            log = ray.get(actor.__ray_call__.remote(lambda w: w.whole_at_gather))
            for whole in log:  # never two modules whole at once, let alone the model
                assert len({_module_of(n) for n in whole}) <= 1, whole
            assert len(log) >= 2 * len(modules)  # specs, then the broadcast: one gather per module
            assert {n for whole in log for n in whole} == set(partitioned)  # each one gathered once
        # what the engine received is the whole (merged) model: a blank engine now scores as the learner
        assert ray.get(engine.weights_checksum.remote()) == pytest.approx(group.weights_checksum(), rel=1e-12)
        probe = [e.token_ids for e in make_batch(9, {"p": [0.0, 1.0]})]
        for x, y in zip(ray.get(engine.logprobs.remote(probe)), group.logprobs(probe), strict=True):
            assert x == pytest.approx(y, abs=1e-5)

        saved = group.save_checkpoint(tmp_path_factory.mktemp("ckpt"), {"iteration": 1})
        start = tmp_path_factory.mktemp("start")
        shutil.copytree(wide_model_dir, start, dirs_exist_ok=True)
        smollm2_tokenizer.save_pretrained(start)
        hf = export_policy(saved, cfg, start, tmp_path_factory.mktemp("hf"))
        exported = ray.remote(EngineDouble).remote(str(hf))
        for x, y in zip(ray.get(exported.logprobs.remote(probe)), group.logprobs(probe), strict=True):
            assert x == pytest.approx(y, abs=1e-5)
        ray.kill(exported)
    finally:
        group.shutdown()
        ray.kill(engine)
