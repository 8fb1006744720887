"""LearnerGroup on real DeepSpeed learner actors (CPU, gloo) over a tiny Llama."""

import math
import random
import shutil

import pytest
import ray
from transformers import AutoModelForCausalLM

from selective_rollout.config.trainer import LoraConfig, TrainerConfig
from selective_rollout.learner import LearnerGroup, latest_checkpoint
from selective_rollout.learner.export import export_policy
from selective_rollout.learner.modeling import checksum
from selective_rollout.precision import native_bf16
from tests.learner.conftest import make_batch, with_choices
from tests.learner.engine_double import EngineDouble

pytestmark = pytest.mark.ray

REWARDS = {"a": [1.0, 0.0, 1.0], "b": [0.0, 0.0, 1.0], "c": [1.0, 1.0, 1.0], "d": [0.0, 1.0, 0.0]}


def batches(n: int) -> list:
    return [make_batch(100 + i, REWARDS, turns=3) for i in range(n)]


def test_zero2_pair_stays_identical_and_matches_one_learner(ray_cluster, tiny_model_dir):
    cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=64, loss_agg="seq-mean-token-mean")
    single = LearnerGroup(cfg, tiny_model_dir, seed=1)
    pair = LearnerGroup(cfg.model_copy(update={"num_learners": 2, "zero_stage": 2}), tiny_model_dir, seed=1)
    try:
        start = single.weights_checksum()
        assert pair.replica_checksums() == [start, start]
        for batch in batches(2):
            m1, m2 = single.train_step(batch), pair.train_step(batch)
            assert m2["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-4, abs=1e-7)
            assert m2["train/grad_norm"] == pytest.approx(m1["train/grad_norm"], rel=1e-4)
            assert m1["train/effective_batch"] == 9.0  # group c has zero variance
            assert m1["train/zero_adv_token_frac"] > 0
        a, b = pair.replica_checksums()
        assert a == b  # bit-identical replicas
        assert a != start
        assert a == pytest.approx(single.weights_checksum(), rel=1e-6)
    finally:
        single.shutdown()
        pair.shutdown()


def test_zero_advantage_sequences_cost_nothing_and_change_nothing(ray_cluster, tiny_model_dir):
    """Zero-variance groups stay in the denominator (the dilution) but get no forward pass; a
    batch with nothing to learn is skipped and leaves the weights untouched."""
    group = LearnerGroup(TrainerConfig(lr=1e-3, micro_batch_tokens=64), tiny_model_dir, seed=1)
    try:
        start = group.weights_checksum()
        m = group.train_step(make_batch(7, {"c": [1.0, 1.0, 1.0], "z": [0.0, 0.0]}, turns=2))
        assert m["train/skipped"] == 1.0 and m["train/zero_adv_token_frac"] == 1.0
        assert group.weights_checksum() == start
        m = group.train_step(make_batch(8, {"a": [1.0, 0.0], "c": [1.0, 1.0, 1.0]}, turns=2))
        assert m["train/skipped"] == 0.0 and m["train/trained_sequences"] == 2.0
        assert m["train/batch_size"] == 5.0 and 0 < m["train/zero_adv_token_frac"] < 1
        assert group.weights_checksum() != start
    finally:
        group.shutdown()


def test_constrained_replies_train_on_their_decision_tokens_only(ray_cluster, tiny_model_dir):
    """Choice sets reach the learners; by default the forced tokens leave the loss (its token
    count), with ``constrained_logprobs: false`` every reply token trains."""
    rng = random.Random(3)
    batch = [with_choices(exp, rng) for exp in make_batch(9, {"a": [1.0, 0.0], "b": [0.0, 1.0]}, turns=3)]
    decisions = sum(len([s for s in e.choice_sets.values() if len(s) > 1]) for e in batch)
    replies = sum(e.num_policy_tokens for e in batch)
    assert 0 < decisions < replies
    for constrained, tokens in ((True, decisions), (False, replies)):
        cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=64, constrained_logprobs=constrained)
        group = LearnerGroup(cfg, tiny_model_dir, seed=1)
        try:
            m = group.train_step(batch)
            assert m["train/policy_tokens"] == tokens and math.isfinite(m["train/grad_norm"])
        finally:
            group.shutdown()


def test_bf16_mixed_runs_the_forward_in_bf16_over_fp32_weights(ray_cluster, tiny_model_dir):
    """precision=bf16-mixed: the same weights score within bf16 rounding of fp32, but not
    identically (the forward ran under autocast); a step trains with a finite, logged grad norm
    and the weights stay fp32 (the checksum moves by less than a bf16 cast would)."""
    fp32 = LearnerGroup(TrainerConfig(lr=1e-3, micro_batch_tokens=64), tiny_model_dir, seed=1)
    mixed = LearnerGroup(
        TrainerConfig(lr=1e-3, micro_batch_tokens=64, precision="bf16-mixed"), tiny_model_dir, seed=1
    )
    try:
        probe = [e.token_ids for e in make_batch(9, {"p": [0.0, 1.0]})]
        exact, rounded = fp32.logprobs(probe), mixed.logprobs(probe)
        assert fp32.weights_checksum() == mixed.weights_checksum()
        for x, y in zip(exact, rounded, strict=True):
            assert y == pytest.approx(x, abs=0.1) and y != pytest.approx(x, abs=1e-6)
        start = mixed.weights_checksum()
        m = mixed.train_step(batches(1)[0])
        assert m["train/grad_norm"] > 0 and math.isfinite(m["train/loss"])
        assert mixed.weights_checksum() != start
        assert mixed.weights_checksum() != mixed.weights_checksum(dtype="bfloat16")  # still fp32
        if_native = LearnerGroup(
            TrainerConfig(lr=1e-3, micro_batch_tokens=64, precision="bf16-mixed-if-native"),
            tiny_model_dir,
            seed=1,
        )
        try:  # resolved in the learner's own process, on its device: it scores like what it chose
            chosen = if_native.logprobs(probe)
            assert chosen == (rounded if native_bf16("cpu") else exact)
        finally:
            if_native.shutdown()
    finally:
        fp32.shutdown()
        mixed.shutdown()


def test_tensor_parallel_engines_get_one_rank_per_worker(ray_cluster, tiny_model_dir):
    """Engines of TP 1, 2 and 4 in one sync group: every worker has its own rank, nobody hangs,
    and every worker of every engine receives the learner's weights."""
    group = LearnerGroup(TrainerConfig(weight_sync="gloo"), tiny_model_dir)
    engines = [ray.remote(EngineDouble).remote(str(tiny_model_dir), tp) for tp in (2, 1, 4)]
    try:
        group.train_step(next(iter(batches(1))))
        group.sync_weights(engines, 1)
        want = group.weights_checksum()
        for engine, tp in zip(engines, (2, 1, 4), strict=True):
            sums = ray.get(engine.worker_checksums.remote())
            assert len(sums) == tp and sums == pytest.approx([want] * tp, rel=1e-12)
    finally:
        group.shutdown()


@pytest.mark.parametrize("method", ["gloo", "object_store"])
def test_weight_sync_makes_the_engine_score_like_the_learner(ray_cluster, tiny_model_dir, method):
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(enabled=True, rank=4), weight_sync=method)
    group = LearnerGroup(cfg, tiny_model_dir)
    engines = [ray.remote(EngineDouble).remote(str(tiny_model_dir)) for _ in range(2)]
    try:
        probe = [e.token_ids for e in make_batch(9, {"p": [0.0, 1.0]})]
        for batch in batches(2):
            group.train_step(batch)
            assert group.sync_weights(engines, 1) > 0
            learner_lp = group.logprobs(probe)
            for engine in engines:
                assert ray.get(engine.weights_checksum.remote()) == pytest.approx(
                    group.weights_checksum(), rel=1e-12
                )
                engine_lp = ray.get(engine.logprobs.remote(probe))
                for x, y in zip(engine_lp, learner_lp, strict=True):
                    assert x == pytest.approx(y, abs=1e-5)
        untouched = ray.get(ray.remote(EngineDouble).remote(str(tiny_model_dir)).logprobs.remote(probe))
        assert untouched[0] != pytest.approx(learner_lp[0], abs=1e-5)  # training moved the policy
    finally:
        group.shutdown()
        for engine in engines:
            ray.kill(engine)


def test_resume_after_kill_reproduces_the_next_step(
    ray_cluster, tiny_model_dir, smollm2_tokenizer, tmp_path, tmp_path_factory
):
    """... and the checkpoint exports (learner/export.py) to an HF model of the weights it saved."""
    cfg = TrainerConfig(lr=1e-3, warmup_steps=5, num_learners=2, zero_stage=1, keep_checkpoints=1)
    first, second, third = batches(3)
    group = LearnerGroup(cfg, tiny_model_dir, seed=2)
    group.train_step(first)
    group.save_checkpoint(tmp_path, {"iteration": 1, "cursor": 9})
    group.train_step(second)
    path = group.save_checkpoint(tmp_path, {"iteration": 2, "cursor": 17})
    saved_sum = group.weights_checksum()
    start = tmp_path_factory.mktemp("start")
    shutil.copytree(tiny_model_dir, start, dirs_exist_ok=True)
    smollm2_tokenizer.save_pretrained(start)
    hf = export_policy(path, cfg, start, tmp_path_factory.mktemp("hf"))
    exported = AutoModelForCausalLM.from_pretrained(hf)
    assert checksum(exported.named_parameters()) == pytest.approx(saved_sum, rel=1e-12)
    expected = group.train_step(third)
    expected_sum = group.weights_checksum()
    group.shutdown()  # the kill: nothing survives but the checkpoint folder

    assert latest_checkpoint(tmp_path) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # keep_checkpoints=1
    resumed = LearnerGroup(cfg, tiny_model_dir, seed=2)
    try:
        assert resumed.resume(tmp_path) == {"iteration": 2, "cursor": 17}
        again = resumed.train_step(third)
        assert again["train/lr"] == expected["train/lr"] == pytest.approx(cfg.lr * 3 / 5)  # mid-warmup
        assert again["train/loss"] == expected["train/loss"]
        assert resumed.replica_checksums() == [expected_sum, expected_sum]
    finally:
        resumed.shutdown()
