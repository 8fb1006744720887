"""End to end, ``driver.pipeline=async`` over real Ray with the transformers engine and the DeepSpeed
learner, on one-step arithmetic episodes (tests/env/arithmetic_env.py): each iteration's rollout is
played under the weights from before the previous update, trained at most one update late with the
decoupled-PPO correction, and every evaluation and the run's end serve the learner's latest
weights."""

from __future__ import annotations

import json

import pytest

from selective_rollout.analysis.report import report_run
from selective_rollout.precision import engine_dtype
from selective_rollout.records import Outcome, read_groups
from selective_rollout.reporting.metrics_log import read_metrics
from tests.e2e.test_train_arithmetic import arithmetic_config

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def run_and_compare_weights(driver):
    """Run the driver to its end and write its report; returns the report's path and the weight
    checksums engine 0 serves and the learner holds (in the engine's dtype), to be compared."""
    import ray

    driver.run()
    report = report_run(driver)
    served = ray.get(driver.engines[0].weights_checksum.remote())
    dtype = engine_dtype(driver.cfg.engine.dtype, "cpu")
    return report, served, driver.learner.weights_checksum(dtype if dtype != "auto" else None)


def test_async_pipeline_plays_ahead_within_the_staleness_bound(ray_cluster, tmp_path):

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
        report, served, learner = run_and_compare_weights(driver)
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
    assert (
        "| pipeline | async (staleness bound 1); groups of the trained batches by version lag: lag 0:" in text
    )
    assert "| importance weights |" in text
    summary = json.loads((run_dir / "report.json").read_text())
    assert summary["pipeline"]["kind"] == "async" and {"before", "iteration 2", "after"} <= set(
        summary["eval"]
    )


def test_an_async_run_killed_with_a_rollout_in_flight_resumes_without_duplicates(ray_cluster, tmp_path):
    """The driver stops after iteration 0's checkpoint while iteration 1's rollout (started before
    iteration 0 trained) is in flight and has logged groups; the same command resumes from the
    checkpoint: those groups move to rollouts.jsonl.rewound, iteration 1 is played again from the
    checkpoint's task cursor, and no group id or metrics iteration is logged twice."""
    import time
    from collections import Counter

    from selective_rollout.driver import Driver
    from selective_rollout.learner.checkpoint import latest_checkpoint, read_extra_state

    run_dir = tmp_path / "run"
    overrides = [
        "driver.iterations=2",
        "driver.pipeline=async",
        "trainer.policy_loss=decoupled_ppo",
        "trainer.save_every=1",
        "rollout.groups_per_iteration=2",
        "rollout.max_groups_in_flight=1",  # iteration 1's groups finish one by one
    ]
    cfg = arithmetic_config(tmp_path, run_dir, overrides)
    first = Driver(cfg, run_dir)
    try:
        first.resume()
        first.start_pipeline()
        first.evaluate("before")
        first.iteration(0)  # trains iteration 0 and checkpoints it; iteration 1 plays meanwhile
        deadline = time.monotonic() + 300
        while not any(g.iteration == 1 for g in read_groups(run_dir / "rollouts.jsonl")):
            assert time.monotonic() < deadline, "iteration 1's rollout logged no group"
            time.sleep(0.2)
    finally:
        first.close()  # the kill: actors gone, iteration 1 never trained
    in_flight = {g.group_id for g in read_groups(run_dir / "rollouts.jsonl") if g.iteration == 1}
    state = read_extra_state(latest_checkpoint(run_dir / "checkpoints"))
    assert state["iteration"] == 1 and state["policy_version"] <= 1

    second = Driver(cfg, run_dir)
    try:
        second.run()
    finally:
        second.close()
    aside = [
        json.loads(line)["group_id"] for line in (run_dir / "rollouts.jsonl.rewound").read_text().splitlines()
    ]
    assert in_flight <= set(aside)
    groups = list(read_groups(run_dir / "rollouts.jsonl"))
    assert not [gid for gid, n in Counter(g.group_id for g in groups).items() if n > 1]
    iterations = Counter(m["iteration"] for m in read_metrics(run_dir / "metrics.jsonl"))
    assert iterations[0] == iterations[1] == 1
    # iteration 1 was played again from the same tasks: its first group is the same task's
    replayed = [g.task_id for g in groups if g.iteration == 1]
    assert replayed and replayed[0] == next(
        json.loads(line)["task_id"] for line in (run_dir / "rollouts.jsonl.rewound").read_text().splitlines()
    )


def test_an_update_sent_in_flight_reaches_the_rollout_playing_and_a_cut_groups_slot_takes_it(
    ray_cluster, tmp_path, monkeypatch
):
    """``driver.sync_in_flight``: iteration 0's update is sent while iteration 1's rollout plays.
    That rollout's first two groups have their second turns held (tests/env/held_env.py) until the
    update has reached the engines and the rollout service. Then the gate cuts one of them (the
    first it is asked about, tests/gate/cut_once.py) and the other plays on: its second turns are
    certainly sampled by the new weights, so they carry the new version in the log
    (``version_runs``) and are fresh to the learner, while both groups keep the version they
    started under. Two slots exist, so the two groups started next (the refill of the cut one
    and the batch's third) take the slots the cut and the finished group freed, under the new
    version whole. The update is certain too: with a KL term no step is skipped."""
    from selective_rollout.driver import Driver
    from selective_rollout.driver.pipeline import RolloutPipeline

    armed, release = tmp_path / "armed", tmp_path / "release"
    prefetch, send = RolloutPipeline.prefetch, Driver.send_weights

    def arm_then_prefetch(self, iteration: int) -> None:
        if iteration == 1:
            armed.touch()  # iteration 1's second turns wait for the release
        prefetch(self, iteration)

    def send_then_release(self, version: int) -> float:
        seconds = send(self, version)
        if armed.exists():
            release.touch()
        return seconds

    monkeypatch.setattr(RolloutPipeline, "prefetch", arm_then_prefetch)
    monkeypatch.setattr(Driver, "send_weights", send_then_release)
    run_dir = tmp_path / "run"
    cfg = arithmetic_config(
        tmp_path,
        run_dir,
        [
            "env.name=tests.env.held_env:Held",
            f"env.armed={armed}",
            f"env.release={release}",
            "rollout.strategy=selective",
            "gate.name=tests.gate.cut_once:CutOnce",
            f"gate.after={release}",
            "gate.k=1",  # asked once the held first step is over
            "rollout.audit_budget=0",  # the gate's cut is a cut, not an audit
            "rollout.refill=true",
            "warm_start.enabled=false",
            "rollout.groups_per_iteration=3",
            "rollout.max_groups_in_flight=2",  # a third group waits for a slot
            "driver.iterations=2",
            "driver.pipeline=async",
            "driver.sync_in_flight=true",
            "trainer.policy_loss=decoupled_ppo",
            "trainer.kl_coef=0.01",
        ],
    )
    driver = Driver(cfg, run_dir)
    try:
        driver.run()
    finally:
        driver.close()

    metrics = {
        m["iteration"]: m for m in read_metrics(run_dir / "metrics.jsonl") if "pipeline/staleness" in m
    }
    assert metrics[0]["pipeline/syncs"] == 1  # iteration 0's update, sent while iteration 1 played
    assert metrics[1]["pipeline/rollout_version"] == 0  # iteration 1 started before that update
    later = sorted(
        (g for g in read_groups(run_dir / "rollouts.jsonl") if g.iteration == 1),
        key=lambda g: int(g.group_id.rsplit("g", 1)[1]),
    )
    assert [g.policy_version for g in later] == [0, 0, 1, 1]
    held = {g.outcome: g for g in later[:2]}  # started under version 0, held until version 1 arrived
    assert set(held) == {Outcome.CUT, Outcome.COMPLETED}
    assert all(len(t.steps) == 1 for t in held[Outcome.CUT].trajectories)  # cut before its second turn
    for traj in held[Outcome.COMPLETED].trajectories:
        second = traj.steps[1]
        assert second.version_runs == [[1, second.completion_tokens]], traj.index
    # the groups started in the freed slots, the cut one's among them, played under version 1
    # whole: every reply at its group's version, nothing to log
    assert all(g.outcome is Outcome.COMPLETED for g in later[2:])
    assert all(not s.version_runs for g in later[2:] for traj in g.trajectories for s in traj.steps)
    assert metrics[1]["rollout/groups_cut"] == 1 and metrics[1]["rollout/groups_trained"] == 3
    # the second turns' tokens are fresh to the learner at version 1: not every token is stale
    assert metrics[1]["offpolicy/stale_token_frac"] < 1
