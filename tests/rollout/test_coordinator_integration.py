"""The coordinator over real Ray, the real ALFWorld engine on generated games and SmolLM2.

No doubles here: engine actors run the real model with constrained choice among admissible
commands, env workers run the real text engine. Greedy decoding makes the G trajectories of a
group identical (a group forced to converge); sampling with tau = 0 gives a group the gate can
never stop.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from selective_rollout.config import load_config
from selective_rollout.envs.alfworld import game_task
from selective_rollout.envs.base import folder_task
from selective_rollout.records import Outcome, TrajectoryStatus, TrajectoryStop, read_groups
from selective_rollout.rollout.coordinator import create_coordinator
from selective_rollout.rollout.engines import create_engines

pytestmark = pytest.mark.ray

BASE = [
    "rollout.group_size=3",
    "rollout.max_steps=6",
    "rollout.max_groups_in_flight=2",
    "gate.k=2",
    "engine.max_new_tokens=12",
    "env.num_workers=2",
    "rollout.audit_budget=0",  # tests that want audits ask for them
]


@pytest.fixture(scope="module")
def engine(ray_cluster, smollm2_path):
    import ray

    cfg = load_config(None, BASE)
    (actor,) = create_engines(cfg.engine, smollm2_path, 1)
    yield actor
    ray.get(actor.shutdown.remote())
    ray.kill(actor)


@pytest.fixture(scope="module")
def tasks(tiny_games):
    from alfworld_env import load_games

    return [game_task(g) for g in load_games(tiny_games, "train")]


def rollout(engine, smollm2_path, tasks, tmp_path, overrides, iteration=0):
    import ray

    cfg = load_config(None, [*BASE, *overrides])
    coordinator = create_coordinator(cfg, [engine], smollm2_path, tmp_path)
    try:
        batch = ray.get(coordinator.rollout.remote(tasks, iteration))
        env = ray.get(coordinator.env_metrics.remote())
    finally:
        ray.get(coordinator.shutdown.remote())
        ray.kill(coordinator)
    return batch, env


def test_converged_group_is_stopped_at_k_and_freed(engine, smollm2_path, tasks, tmp_path):
    import ray

    batch, env = rollout(
        engine,
        smollm2_path,
        tasks[:1],
        tmp_path,
        [
            "engine.temperature=0",
            "rollout.strategy=selective",
            "rollout.groups_per_iteration=1",
            "rollout.refill=false",
            "gate.tau=0.12",
        ],
    )
    (record,) = batch.groups
    if record.outcome is Outcome.COMPLETED:
        # greedy trajectories are identical; the only way to escape the gate is to finish before K
        assert all(len(t.steps) < 2 for t in record.trajectories)
        pytest.skip("the greedy policy solved the game before the gate step")
    assert record.outcome is Outcome.CUT
    assert record.gate.step == 2 and record.gate.features["prefix_edit_distance"] == 0.0
    assert all(t.reward is None and len(t.steps) >= 2 for t in record.trajectories)
    assert env["env/episodes_open"] == 0  # the group's episodes were closed
    health = ray.get(engine.health.remote())
    assert health["running_requests"] == 0 and health["cached_sessions"] == 0
    assert batch.experiences == []
    assert [g.outcome for g in read_groups(tmp_path / "rollouts.jsonl")] == [Outcome.CUT]


def test_divergent_group_runs_to_the_end(engine, smollm2_path, tasks, tmp_path):
    batch, _ = rollout(
        engine,
        smollm2_path,
        tasks[:1],
        tmp_path,
        [
            "engine.temperature=1.0",
            "rollout.strategy=selective",
            "rollout.groups_per_iteration=1",
            "gate.tau=0.0",
        ],
    )
    (record,) = batch.groups
    assert record.outcome is Outcome.COMPLETED and not record.gate.stop
    for t in record.trajectories:
        assert t.reward is not None and t.status.value in ("finished", "truncated")
        assert t.won or len(t.steps) == 6
    # every trajectory reaches the learner as token ids with its own tokens masked in
    assert len({e.trajectory for e in batch.experiences}) == 3
    for e in batch.experiences:
        assert sum(e.loss_mask) > 0 and len(e.token_ids) == len(e.old_logprobs)
        assert all(lp <= 0.0 for lp, m in zip(e.old_logprobs, e.loss_mask, strict=True) if m)


def test_refill_and_audit(engine, smollm2_path, tasks, tmp_path):
    """Greedy groups all converge: each one is audited (run on in shadow, never trained on) and the
    coordinator refills with new tasks up to its cap; the audit confirms the gate was right."""
    batch, _ = rollout(
        engine,
        smollm2_path,
        tasks,
        tmp_path,
        [
            "engine.temperature=0",
            "rollout.strategy=selective",
            "rollout.groups_per_iteration=1",
            "rollout.max_groups_factor=2",
            "rollout.audit_budget=1.0",
        ],
    )
    audited = [g for g in batch.groups if g.outcome is Outcome.AUDITED]
    kept = [g for g in batch.groups if g.outcome is Outcome.COMPLETED]
    assert len(kept) == 1 or len(batch.groups) == 2  # refilled to the target, or stopped at the cap
    assert len(batch.groups) >= 2 or kept
    for g in audited:
        assert g.has_final_rewards and g.zero_variance  # identical greedy trajectories: identical rewards
    if audited:
        assert batch.metrics["gate/audit_precision"] == 1.0
    assert all(e.group_id in {g.group_id for g in kept} for e in batch.experiences)


def test_dapo_drops_exactly_the_zero_variance_groups(engine, smollm2_path, tasks, tmp_path):
    batch, _ = rollout(
        engine,
        smollm2_path,
        tasks[:3],
        tmp_path,
        [
            "engine.temperature=1.0",
            "rollout.strategy=dapo",
            "rollout.groups_per_iteration=3",
            "rollout.refill=false",
        ],
    )
    assert len(batch.groups) == 3
    for g in batch.groups:
        assert g.outcome is (Outcome.FILTERED if g.zero_variance else Outcome.COMPLETED)
        assert g.gate is None


def test_killed_env_worker_loses_no_finished_trajectory(engine, smollm2_path, tasks, tmp_path):
    import ray

    cfg = load_config(
        None,
        [
            *BASE,
            "engine.temperature=1.0",
            "rollout.strategy=none",
            "rollout.groups_per_iteration=4",
            "rollout.max_groups_in_flight=2",
        ],
    )
    coordinator = create_coordinator(cfg, [engine], smollm2_path, tmp_path)
    try:
        pids = ray.get(coordinator.env_worker_pids.remote())
        ref = coordinator.rollout.remote(tasks[:4], 0)
        log = tmp_path / "rollouts.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 1):
            time.sleep(0.5)
        finished_before = log.read_text() if log.exists() else ""
        os.kill(pids[0], signal.SIGKILL)
        batch = ray.get(ref, timeout=900)
    finally:
        ray.get(coordinator.shutdown.remote())
        ray.kill(coordinator)
    logged = list(read_groups(tmp_path / "rollouts.jsonl"))
    # everything finished before the kill is still on disk, byte for byte
    assert (tmp_path / "rollouts.jsonl").read_text().startswith(finished_before)
    assert len(logged) == len(batch.groups)
    # the iteration completed: every task either finished or failed and was retried
    completed = [g for g in logged if g.outcome is Outcome.COMPLETED]
    assert completed and all(g.has_final_rewards for g in completed)
    assert {g.task_id for g in completed} | {g.task_id for g in logged if g.outcome is Outcome.FAILED} == {
        t.task_id for t in tasks[:4]
    }


def test_bad_game_is_reported_by_path_and_skipped_in_training_and_evaluation(
    engine, smollm2_path, tasks, broken_game, tmp_path
):
    """The issue's reproduction: a game whose PDDL does not parse used to hang the run forever."""
    import ray

    from selective_rollout.driver.held_out import success_summary

    bad = folder_task(str(broken_game), "broken-task", tasks[0].task_type)
    cfg = load_config(None, [*BASE, "rollout.strategy=none", "rollout.groups_per_iteration=1"])
    coordinator = create_coordinator(cfg, [engine], smollm2_path, tmp_path)
    try:
        batch = ray.get(coordinator.rollout.remote([bad, tasks[1]], 0), timeout=600)
        again = ray.get(coordinator.rollout.remote([bad, tasks[2]], 1), timeout=600)
        held_out = ray.get(coordinator.evaluate.remote([bad, tasks[3]]), timeout=600)
    finally:
        ray.get(coordinator.shutdown.remote())
        ray.kill(coordinator)
    failed = [g for g in batch.groups if g.outcome is Outcome.FAILED]
    assert [g.task_id for g in failed] == ["broken-task"]
    assert str(broken_game / "game.tw-pddl") in failed[0].meta["failure"]
    assert [g.outcome for g in batch.groups if g.task_id != "broken-task"] == [Outcome.COMPLETED]
    assert (again.groups[0].task_id, again.groups[0].outcome) == ("broken-task", Outcome.SKIPPED)
    logged = list(read_groups(tmp_path / "rollouts.jsonl"))
    assert "ParseError" in next(g for g in logged if g.task_id == "broken-task").meta["failure"]
    summary = success_summary(held_out)
    assert summary["tasks"] == 1 and list(summary["failed"]) == ["broken-task"]
    assert "ParseError" in summary["failed"]["broken-task"]


def test_a_trajectory_stop_inside_a_kept_group_and_its_audited_label(engine, smollm2_path, tasks, tmp_path):
    """``looping`` over a window of 2 actions with up to 2 distinct ones judges every trajectory
    still running at step 2 decided, whatever the untrained model plays, so the rule fires on each
    of them there. The gate looks at step 2 and keeps the group (tau 0). With a budget between 0 and
    1 the run's first stop is audited (it plays on, and its label is measured) while the budget can
    price no second audit before anything has finished, so the group's other stops end their
    trajectories at step 2 with reward 0 (a budget of 1 would audit every stop and stop none)."""
    kept = [
        "engine.temperature=1.0",
        "rollout.strategy=selective",
        "gate.tau=0.0",
        "rollout.groups_per_iteration=1",
    ]
    looping = ["name=looping", "window=2", "max_distinct=2", "min_step=2"]
    overrides = [*kept, "rollout.audit_budget=0.5", *(f"trajectory_stop.{o}" for o in looping)]
    batch, env = rollout(engine, smollm2_path, tasks[:1], tmp_path, overrides)
    (record,) = batch.groups
    assert record.outcome is Outcome.COMPLETED and (record.gate.step, record.gate.stop) == (2, False)
    assert list(read_groups(tmp_path / "rollouts.jsonl")) == [record]
    asked = [t for t in record.trajectories if t.stop is not None]
    assert asked == [t for t in record.trajectories if len(t.steps) > 2 or t.stop is not None]
    (audited,) = [t for t in asked if t.stop.audited]
    stopped = [t for t in asked if not t.stop.audited]
    assert stopped, "every trajectory but the audited one ended before step 2"
    for t in stopped:
        assert t.status is TrajectoryStatus.STOPPED and t.reward == 0.0 and len(t.steps) == 2
        assert t.stop == TrajectoryStop(2, 0.0, "looping")
    # the audited one ran on to its end; its true reward says whether the label was right
    assert audited.stop.step == 2 and audited.status in (
        TrajectoryStatus.FINISHED,
        TrajectoryStatus.TRUNCATED,
    )
    assert audited.won or len(audited.steps) == 6
    assert audited.label_right is (audited.reward == 0.0)
    assert batch.metrics["trajectory_stop/stopped"] == len(stopped)
    assert batch.metrics["trajectory_stop/audited"] == 1
    assert batch.metrics["trajectory_stop/label_precision"] == float(audited.label_right)
    # the learner gets every trajectory, the stopped ones with their assigned reward and own tokens
    rewards = {e.trajectory: e.reward for e in batch.experiences}
    assert rewards == {t.index: t.reward for t in record.trajectories}
    assert all(sum(e.loss_mask) > 0 for e in batch.experiences)
    assert env["env/episodes_open"] == 0
