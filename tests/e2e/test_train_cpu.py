"""End to end: the CPU profile for 2 iterations over real Ray, the real ALFWorld engine, SmolLM2
and the DeepSpeed learner, with a tiny budget. Checks the run folder a user gets."""

from __future__ import annotations

import json

import pytest

from selective_rollout.analysis.gate_eval.evaluate import main as gate_evaluate
from selective_rollout.analysis.report import report_run
from selective_rollout.config import load_config
from selective_rollout.placement import read_placement
from selective_rollout.precision import engine_dtype
from selective_rollout.records import read_groups
from selective_rollout.reporting.metrics_log import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_cpu_profile_two_iterations(ray_cluster, tiny_games, tmp_path):
    import ray

    from selective_rollout.driver import Driver

    run_dir = tmp_path / "run"
    cfg = load_config(
        "configs/cpu_default.yaml",
        [
            f"env.games_dir={tiny_games}",
            "env.preset=tiny",  # the tiny_games fixture (the profile plays medium games)
            "env.n_train=6",  # the tiny_games fixture's set
            "env.n_valid=2",
            "env.num_workers=1",
            "rollout.group_size=3",
            # 3 trainable groups, refilled up to 6 started: every one of the 6 tasks is tried in the
            # first iteration, and 2 of them give mixed groups with this warm start (bench/regime.py)
            "rollout.groups_per_iteration=3",
            "rollout.max_groups_in_flight=2",
            "rollout.max_steps=6",
            # the profile's 0.7 on a policy cloned from few walkthroughs leaves 3-rollout groups all
            # failing; sampled hotter, some are mixed and the learner has something to learn from
            "engine.temperature=1.0",
            "rollout.audit_budget=1.0",
            # the paper's gate (the profile's stalled one decides at step 11, past these episodes)
            "gate.name=prefix_edit",
            "gate.k=2",
            "gate.tau=0.3",  # stops the groups whose first two actions agree (all zero-variance here)
            "logging.regime_k=3",  # the report reads D_K here, not at the gate's step
            "warm_start.games=6",
            "warm_start.epochs=3",
            f"warm_start.cache_dir={tmp_path / 'warm'}",
            "eval.num_tasks=1",  # before and after: what the report needs, at the least cost
            "driver.iterations=2",
            "driver.update_check=true",  # an update served whatever the rollouts hold
            f"driver.run_dir={run_dir}",
            "logging.backends=[jsonl,wandb]",
            "logging.progress=false",
        ],
    )
    driver = Driver(cfg, run_dir)
    try:
        before = ray.get(driver.engines[0].weights_checksum.remote())
        driver.run()
        report = report_run(driver)
        after_engine = ray.get(driver.engines[0].weights_checksum.remote())
        dtype = engine_dtype(cfg.engine.dtype, "cpu")
        after_learner = driver.learner.weights_checksum(dtype if dtype != "auto" else None)
    finally:
        driver.close()
    # closing frees the engines even though this test still holds their handles
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(driver.engines[0].health.remote(), timeout=60)

    # the policy changed, and the engines serve exactly the learner's weights
    assert after_engine != before
    assert after_engine == pytest.approx(after_learner, rel=1e-9)

    logged = list(read_metrics(run_dir / "metrics.jsonl"))
    (check,) = [m for m in logged if "check/served_shift" in m]  # logged once, before the rollouts
    assert check["iteration"] == -1 and check["check/grad_norm"] > 0 and check["check/served_shift"] > 0
    assert check["check/served_logprob_gap"] <= cfg.trainer.served_weights_tol
    metrics = [m for m in logged if m["iteration"] in (0, 1)]
    assert [m["iteration"] for m in metrics] == [0, 1]
    for m in metrics:
        for key in (
            "rollout/groups_started",
            "rollout/step_tokens",
            "rollout/wall_s",
            "gate/fires",
            "system/tokens_per_s",
            "system/iteration_s",
            "system/engine_wait_frac",  # the barrier: who waited, each iteration
            "system/learner_wait_frac",
            "env/steps",
            "system/rss_gb/engine_0",  # every actor's resident memory, each iteration
            "system/rss_gb/learner_0",
            "system/rss_gb/coordinator",
            "system/rss_gb/driver",
        ):
            assert key in m, key
        # a 135M-parameter model in bf16 alone is 0.27 GB: a figure below it is not this process's
        assert 0.27 < m["system/rss_gb/engine_0"] < 20 and 0.27 < m["system/rss_gb/learner_0"] < 20
    assert any("train/loss" in m and "system/weight_sync_s" in m for m in metrics)

    groups = list(read_groups(run_dir / "rollouts.jsonl"))
    assert groups and all(g.g == 3 for g in groups if g.trajectories)
    assert report == run_dir / "report.md"
    text = report.read_text()
    assert "held-out success before" in text and "held-out success after" in text
    assert "| peak resident memory | engine " in text and "learner " in text
    assert "| hardware waiting | engines " in text and "trained tokens per engine-second |" in text
    # placement.learner_allocator defaults to auto: jemalloc on a Ray the driver started here
    located = read_placement(run_dir)
    assert [loc["malloc"] for loc in located["learners"]] == ["jemalloc"]
    assert [loc["malloc"] for loc in located["engines"]] == ["system"]
    assert any(ln.startswith("| learners | 1 | 1 |") and "| jemalloc x1 |" in ln for ln in text.splitlines())
    summary = json.loads((run_dir / "report.json").read_text())
    assert summary["iterations"] == 2 and {"before", "after"} <= set(summary["eval"])
    assert set(summary["peak_rss_gb"]) == {"driver", "learner", "engine", "coordinator"}
    assert all(e["wall_s"] > 0 for e in summary["eval"].values())  # what an experiment's precision costs
    for e in summary["eval"].values():  # every try's outcome, for pairing before and after try by try
        assert e["per_try"].keys() == e["per_task"].keys()
        assert all(sum(w) / len(w) == e["per_task"][t] for t, w in e["per_try"].items())
    rollout, regime = summary["rollout"], summary["regime"]
    assert regime["k"] == 3 and regime["groups"] == sum(g.zero_variance is not None for g in groups)
    saving_row = next(ln for ln in text.splitlines() if ln.startswith("| step-tokens saved"))
    if rollout["gate_fires"]:  # the first stop is always audited; the saving is always estimated
        assert rollout["audited"] >= 1 and rollout["audit_precision_ci95"] is not None
        assert "n/a" not in saving_row and rollout["step_tokens_saved_basis"] in saving_row
    assert (run_dir / "training_curves.png").stat().st_size > 10_000
    assert (run_dir / "config.yaml").is_file()
    assert list((run_dir / "checkpoints").glob("iter_*"))

    # the log is what the offline gate evaluation reads
    assert gate_evaluate(
        [
            "--rollouts",
            str(run_dir / "rollouts.jsonl"),
            "--out",
            str(tmp_path / "ge"),
            "--k",
            "2",
            "--tau",
            "0.1,0.5",
        ]
    ) in (0, 2)
    if any(g.has_final_rewards for g in groups):
        assert (tmp_path / "ge" / "gate_eval.csv").is_file()
