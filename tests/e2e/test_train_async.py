"""End to end, ``driver.pipeline=async`` over real Ray with the transformers engine and the DeepSpeed
learner, on one-step arithmetic episodes (tests/env/arithmetic_env.py): each iteration's rollout is
played under the weights from before the previous update, trained at most one update late with the
decoupled-PPO correction, and every evaluation and the run's end serve the learner's latest
weights."""

from __future__ import annotations

import json

import pytest

from selective_rollout.precision import engine_dtype
from selective_rollout.records import read_groups
from selective_rollout.reporting.metrics_log import read_metrics
from tests.e2e.test_train_arithmetic import arithmetic_config

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_async_pipeline_plays_ahead_within_the_staleness_bound(ray_cluster, tmp_path):
    import ray

    from selective_rollout.driver import Driver

    run_dir = tmp_path / "run"
    cfg = arithmetic_config(
        tmp_path,
        run_dir,
        [
            "driver.iterations=3",
            "driver.eval_every=2",  # an evaluation while iteration 2's rollout is in flight
            "driver.pipeline=async",
            "driver.max_staleness=1",
            "driver.update_check=true",  # version 1 before the first rollout, whatever it holds
            "trainer.policy_loss=decoupled_ppo",
        ],
    )
    driver = Driver(cfg, run_dir)
    try:
        report = driver.run()
        served = ray.get(driver.engines[0].weights_checksum.remote())
        dtype = engine_dtype(cfg.engine.dtype, "cpu")
        learner = driver.learner.weights_checksum(dtype if dtype != "auto" else None)
        final_version = driver.pipeline.learner_version
    finally:
        driver.close()

    metrics = {
        m["iteration"]: m for m in read_metrics(run_dir / "metrics.jsonl") if "pipeline/staleness" in m
    }
    assert sorted(metrics) == [0, 1, 2]
    updated = {it: int(not m.get("train/skipped", 1.0)) for it, m in metrics.items()}
    # iteration 0 is fresh; iteration 1 was started before iteration 0's update (version 1, the
    # update check's), so it lags exactly by that update
    assert metrics[0]["pipeline/rollout_version"] == 1 and metrics[0]["pipeline/staleness"] == 0
    assert metrics[1]["pipeline/rollout_version"] == 1
    assert metrics[1]["pipeline/staleness"] == updated[0]
    # iteration 2 started under the engines' weights after iteration 0's update (the bound forced
    # a sync when it bound), and never lags by more than one update
    assert metrics[2]["pipeline/rollout_version"] == 1 + updated[0]
    assert all(m["pipeline/staleness"] <= 1 for m in metrics.values())
    assert final_version == 1 + sum(updated.values())
    for it, m in metrics.items():
        if "offpolicy/staleness_max" in m:
            assert m["offpolicy/staleness_max"] == m["pipeline/staleness"], it
        if m["pipeline/staleness"] and updated[it]:  # stale tokens were trained: their weights were logged
            assert m["offpolicy/stale_token_frac"] > 0 and m["offpolicy/is_max"] > 0
            assert 0 < m["offpolicy/ess"] <= 1
    # every group carries the version that played it
    for group in read_groups(run_dir / "rollouts.jsonl"):
        if group.iteration >= 0:
            assert group.policy_version == metrics[group.iteration]["pipeline/rollout_version"]
    # the evaluation after iteration 1 and the final one scored the learner's latest weights
    assert served == pytest.approx(learner, rel=1e-9)
    text = report.read_text()
    assert "| pipeline | async (staleness bound 1); groups trained by version lag: lag 0:" in text
    assert "| importance weights |" in text
    summary = json.loads((run_dir / "report.json").read_text())
    assert summary["pipeline"]["kind"] == "async" and {"before", "iteration 2", "after"} <= set(
        summary["eval"]
    )
