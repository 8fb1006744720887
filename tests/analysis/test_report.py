"""The run report's own figures: the gate's saving with its basis, the regime of the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selective_rollout.analysis.report import (
    peak_memory,
    regime_summary,
    rollout_summary,
    saving_estimate,
    write_report,
)
from selective_rollout.records import (
    GateRecord,
    GroupRecord,
    GroupWriter,
    Outcome,
    Step,
    Trajectory,
    TrajectoryStatus,
    TrajectoryStop,
)


def _group(outcome, task_type, actions, rewards, gate_step=None, tokens=10):
    trajectories = [
        Trajectory(i, [Step(a, True, tokens, 0) for a in acts], reward=r, won=bool(r))
        for i, (acts, r) in enumerate(zip(actions, rewards, strict=True))
    ]
    gate = GateRecord(step=gate_step, stop=True, reason="", features={}) if gate_step else None
    return GroupRecord("g", "t", task_type, trajectories, outcome, gate=gate)


CUT = _group(Outcome.CUT, "heat", [["a", "b"], ["a", "b"]], [None, None], gate_step=2)
HEAT = _group(Outcome.COMPLETED, "heat", [["a", "b", "c", "d"], ["a", "x", "c"]], [1.0, 0.0])
COOL = _group(Outcome.COMPLETED, "cool", [["a"] * 10, ["b"] * 10], [0.0, 0.0])


def test_no_cut_saves_nothing_and_says_so():
    assert saving_estimate([HEAT]) == (0.0, "no group was cut")


def test_without_audits_a_cut_is_priced_by_whole_groups_of_its_type():
    saved, basis = saving_estimate([CUT, HEAT, COOL])
    # the heat group spent 2 + 1 steps x 10 tokens after step 2; the cool group is another type
    assert saved == pytest.approx(30.0)
    assert "same task type" in basis and "1 of 1" in basis


def test_audited_groups_are_the_preferred_witness():
    audited = _group(Outcome.AUDITED, "cool", [["a"] * 6, ["a"] * 6], [1.0, 1.0], gate_step=2)
    saved, basis = saving_estimate([CUT, HEAT, audited])
    assert saved == pytest.approx(2 * 4 * 10) and "1 audited" in basis


def test_summary_never_leaves_the_saving_unknown_when_the_gate_fired():
    summary = rollout_summary([CUT, HEAT, COOL])
    assert summary["gate_fires"] == 1 and summary["step_tokens_saved_est"] > 0
    assert summary["step_tokens_past_cut"] == 0  # CUT stopped at its gate step
    overshot = _group(Outcome.CUT, "heat", [["a", "b", "c"], ["a", "b"]], [None, None], gate_step=2)
    assert rollout_summary([overshot, HEAT])["step_tokens_past_cut"] == 10  # one step past K
    assert summary["audit_precision"] is None and summary["audit_precision_ci95"] is None
    audited = _group(Outcome.AUDITED, "cool", [["a"] * 6, ["a"] * 6], [1.0, 1.0], gate_step=2)
    summary = rollout_summary([CUT, audited])
    assert summary["audit_precision"] == 1.0 and summary["audit_precision_ci95"][1] == 1.0
    # the stopped group's class is known from its audit: an all-succeed one
    assert summary["audited_by_class"] == {"all-fail": 0, "all-succeed": 1, "informative": 0}
    assert summary["audit_step_tokens"] == 80


def test_regime_counts_outcome_kinds_lengths_and_distinct_divergences():
    win = _group(Outcome.COMPLETED, "heat", [["a", "b"], ["a", "b"]], [1.0, 1.0])
    regime = regime_summary([CUT, HEAT, COOL, win], k=2)
    assert regime["groups"] == 3  # the cut group has no outcome
    assert regime["all_fail_frac"] == pytest.approx(1 / 3) and regime["all_succeed_frac"] == pytest.approx(
        1 / 3
    )
    assert regime["median_trajectory_steps"] == pytest.approx(3.5)  # lengths 2, 2, 3, 4, 10, 10
    assert regime["d_k_distinct"] == 3  # D_2: 0.5 (HEAT), 1.0 (COOL), 0.0 (win)


def test_held_out_gain_is_paired_per_task():
    from selective_rollout.analysis.policy_eval import success_gain

    before = {"per_task": {"a": 0.0, "b": 0.0, "c": 1.0, "gone": 1.0}}
    after = {"per_task": {"a": 1.0, "b": 1.0, "c": 1.0, "new": 0.0}}
    gain = success_gain(before, after, resamples=500)
    assert gain["tasks"] == 3 and gain["mean"] == pytest.approx(2 / 3)
    assert (gain["improved"], gain["worsened"]) == (2, 0)
    # two flips of three tasks: as likely as not under "no change" (exact sign test)
    assert gain["p_value"] == pytest.approx(0.5)
    assert -1.0 <= gain["ci95"][0] < 0.0 < 2 / 3 < gain["ci95"][1] <= 1.0
    assert success_gain({"per_task": {}}, after) is None


def test_one_task_of_eight_flipping_reads_as_no_change_with_an_interval_that_admits_a_gain():
    from selective_rollout.analysis.policy_eval import describe_gain, success_gain

    tasks = [f"t{i}" for i in range(8)]
    before = {"per_task": dict(zip(tasks, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], strict=True))}
    after = {"per_task": {**before["per_task"], "t0": 0.0}}
    gain = success_gain(before, after)
    assert gain["mean"] == pytest.approx(-0.125) and gain["p_value"] == pytest.approx(1.0)
    lo, hi = gain["ci95"]
    assert lo < -0.125 and hi > 0.0  # the bootstrap over tasks read [-37.5%, +0.0%]
    words = describe_gain(gain)
    assert "indistinguishable from no change" in words and "1 worsened" in words

    # every task improving is a gain the test can see: p = 2 / 2**8
    after = {"per_task": {t: 1.0 for t in tasks}}
    before = {"per_task": {t: 0.0 for t in tasks}}
    gain = success_gain(before, after)
    assert gain["p_value"] == pytest.approx(2 / 256) and gain["ci95"][0] > 0.0
    assert describe_gain(gain).startswith("+100.0%: a gain")


def test_fractional_task_rates_use_the_bootstrap_interval_and_the_sign_flip_test():
    from selective_rollout.analysis.policy_eval import success_gain

    before = {"per_task": {"a": 0.0, "b": 0.25, "c": 0.5, "d": 0.5}}
    after = {"per_task": {"a": 0.5, "b": 0.75, "c": 1.0, "d": 0.75}}
    gain = success_gain(before, after, resamples=500)
    assert gain["interval"] == "bootstrap over tasks"
    assert gain["p_value"] == pytest.approx(2 / 16)  # four same-sign changes, exact enumeration
    assert 0.25 <= gain["ci95"][0] <= gain["mean"] <= gain["ci95"][1] <= 0.5


def test_held_out_tries_pair_by_index_and_their_correlation_is_measured():
    from selective_rollout.analysis.policy_eval import per_try_changes, success_gain, try_correlation

    rates = {"a": 0.5, "b": 0.5, "c": 0.5}
    before = {"per_task": rates, "per_try": {"a": [1, 0], "b": [0, 1], "c": [1, None]}}
    repeated = {"per_task": rates, "per_try": {"a": [1, 0], "b": [0, 1], "c": [1, 0]}}
    swapped = {"per_task": rates, "per_try": {"a": [0, 1], "b": [1, 0], "c": [0, 1]}}
    # "c" lost an episode before: it is not paired
    assert per_try_changes(before, swapped) == {"a": [-1, 1], "b": [1, -1]}
    assert try_correlation(before, repeated) == pytest.approx(1.0)
    assert try_correlation(before, swapped) == pytest.approx(-1.0)
    assert success_gain(before, repeated, resamples=100)["try_correlation"] == pytest.approx(1.0)
    # summaries from before per-try outcomes were recorded: no correlation, no failure
    assert success_gain({"per_task": {"a": 0.0}}, {"per_task": {"a": 1.0}})["try_correlation"] is None


def test_peak_memory_is_the_largest_process_of_each_kind_over_the_iterations():
    metrics = [
        {
            "iteration": 0,
            "system/rss_gb/engine_0": 2.0,
            "system/rss_gb/engine_1": 3.5,
            "system/rss_gb/driver": 0.4,
        },
        {
            "iteration": 1,
            "system/rss_gb/engine_0": 4.0,
            "system/rss_gb/learner_0": 6.0,
            "rollout/wall_s": 9.0,
        },
        {"iteration": 2, "system/rss_gb/engine_1": 1.0, "system/rss_gb/learner_10": 7.5},
    ]
    assert peak_memory(metrics) == {"engine": 4.0, "driver": 0.4, "learner": 7.5}
    assert list(peak_memory(metrics)) == ["engine", "driver", "learner"]  # first-logged order
    assert peak_memory([{"iteration": 0, "rollout/wall_s": 1.0}]) == {}


def test_the_report_shows_the_gates_own_state_at_the_last_iteration(tmp_path: Path) -> None:
    rows = [
        {"iteration": 0, "gate/fires": 1.0, "gate/state/step": 11.0, "gate/state/step_labelled": 8.0},
        {"iteration": 1, "gate/fires": 2.0, "gate/state/step": 9.0, "gate/state/step_labelled": 30.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(tmp_path, {"iteration": 2}, regime_k=4).read_text()
    assert "| gate's own state | step 9, step_labelled 30 (what the gate set" in report
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "gate/fires": 0.0}) + "\n")
    assert "gate's own state" not in write_report(tmp_path, {"iteration": 1}, regime_k=4).read_text()


def test_the_report_counts_trajectory_stops_and_their_audited_labels(tmp_path: Path) -> None:
    steps = [Step("a", True, 10, 0)] * 3
    stopped = Trajectory(
        0, steps, 0.0, status=TrajectoryStatus.STOPPED, stop=TrajectoryStop(3, 0.0, "outlived")
    )
    right = Trajectory(1, steps, 0.0, stop=TrajectoryStop(3, 0.0, "outlived", audited=True))
    wrong = Trajectory(2, steps, 1.0, won=True, stop=TrajectoryStop(3, 0.0, "outlived", audited=True))
    winner = Trajectory(3, steps, 1.0, won=True)
    group = GroupRecord("g", "t", "heat", [stopped, right, wrong, winner], Outcome.COMPLETED)
    assert rollout_summary([group])["trajectory_stops"] == {"stopped": 1, "audited": 2, "label_right": 1}
    with GroupWriter(tmp_path / "rollouts.jsonl") as w:
        w.write(group)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 0}) + "\n")
    report = write_report(tmp_path, {"iteration": 1}, regime_k=2).read_text()
    assert (
        "| trajectory stops | 1 trajectories ended early with an assigned reward; "
        "1 of 2 audited labels right |" in report
    )
    assert rollout_summary([HEAT])["trajectory_stops"] == {"stopped": 0, "audited": 0, "label_right": 0}
