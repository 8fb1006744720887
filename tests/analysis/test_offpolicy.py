"""The report's pipeline and importance-weight rows, from the iterations' metrics."""

from __future__ import annotations

import json

import pytest

from selective_rollout.analysis.offpolicy import offpolicy_rows, offpolicy_summary


def iteration(it: int, lag: int, stale_frac: float, **weights: float) -> dict[str, float]:
    row = {
        "iteration": it,
        "pipeline/staleness": float(lag),
        "pipeline/syncs": 1.0,
        "pipeline/rollout_wait_s": 10.0,
        f"offpolicy/groups_lag_{lag}": 4.0,
        "offpolicy/stale_token_frac": stale_frac,
        "train/policy_tokens": 100.0,
    }
    row.update({f"offpolicy/{k}": v for k, v in weights.items()})
    return row


def test_async_iterations_sum_lags_and_weigh_the_importance_weights_by_stale_tokens():
    rows = [
        {"iteration": -1, "eval/success_rate": 0.5},  # an evaluation line: not an iteration
        iteration(0, 0, 0.0),
        iteration(1, 1, 1.0, is_mean=1.2, is_max=3.0, is_truncated_frac=0.1, ess=0.9),
        iteration(2, 1, 0.5, is_mean=0.9, is_max=1.5, is_truncated_frac=0.0, ess=0.8),
    ]
    summary = offpolicy_summary(rows)
    assert summary["groups_by_lag"] == {0: 4, 1: 8}
    assert summary["syncs"] == 3 and summary["rollout_wait_s"] == 30.0
    assert summary["stale_tokens"] == 150.0
    assert summary["is_mean"] == pytest.approx((1.2 * 100 + 0.9 * 50) / 150)
    assert summary["is_max"] == 3.0 and summary["ess_min"] == 0.8
    assert summary["is_truncated_frac"] == pytest.approx(10 / 150)
    pipeline, weights = offpolicy_rows(summary, "async", 1)
    assert (
        "async (staleness bound 1); groups of the trained batches by version lag: lag 0: 4, lag 1: 8; "
        "weight syncs: 3" in pipeline
    )
    assert "50% of trained tokens stale; weight mean 1.100, max 3.00, 6.67% truncated" in weights
    assert "smallest effective sample size 80%" in weights


def test_a_sync_run_says_no_token_was_stale_and_an_old_log_says_not_recorded(tmp_path):
    rows = [iteration(0, 0, 0.0), iteration(1, 0, 0.0)]
    pipeline, weights = offpolicy_rows(offpolicy_summary(rows), "sync", 1)
    assert "sync (staleness 0 by construction)" in pipeline
    assert "none: every trained token was sampled by the learner's weights" in weights
    assert offpolicy_summary([{"iteration": 0, "rollout/wall_s": 1.0}]) is None
    assert offpolicy_rows(None, "sync", 1) == [
        "| pipeline | not recorded (a run logged before pipeline/* metrics) |"
    ]

    from selective_rollout.analysis.report import write_report

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(tmp_path, {"iteration": 2}, regime_k=4, pipeline="sync").read_text()
    assert (
        "| pipeline | sync (staleness 0 by construction); groups of the trained batches by version lag: "
        "lag 0: 8" in report
    )


def test_the_gates_outcomes_are_counted_by_the_version_lag_they_were_trained_at():
    from selective_rollout.analysis.offpolicy import outcomes_by_lag
    from selective_rollout.records import GroupRecord, Outcome, Trajectory

    def group(gid: str, it: int, version: int, outcome: Outcome, rewards=(1.0, 0.0)) -> GroupRecord:
        trajectories = [Trajectory(i, [], reward=r) for i, r in enumerate(rewards)]
        return GroupRecord(gid, "t", "x", trajectories, outcome, it, policy_version=version)

    groups = [
        group("a", 0, 1, Outcome.COMPLETED),
        group("b", 0, 1, Outcome.CUT, (None, None)),
        group("c", 1, 1, Outcome.COMPLETED),  # played before iteration 0's update: lag 1
        group("d", 1, 1, Outcome.AUDITED, (0.0, 0.0)),
        group("e", 1, 1, Outcome.SKIPPED, ()),  # never played: not counted
        group("f", -1, 2, Outcome.COMPLETED),  # an evaluation: not counted
    ]
    metrics = [
        {"iteration": 0, "pipeline/learner_version": 1},
        {"iteration": 1, "pipeline/learner_version": 2},
    ]
    by_lag = outcomes_by_lag(groups, metrics)
    assert by_lag == {
        0: {"started": 2, "cut": 1, "audited": 0, "trained": 1, "dropped": 0},
        1: {"started": 2, "cut": 0, "audited": 1, "trained": 1, "dropped": 0},
    }
    rows = offpolicy_rows(offpolicy_summary([iteration(0, 0, 0.0)]), "async", 1, by_lag)
    assert (
        "| groups by version lag | lag 0: 2 started, 1 cut, 0 audited, 1 trained, 0 dropped; lag 1: 2 started"
        in rows[1]
    )


def test_weights_only_measured_say_so_and_the_final_sync_counts():
    rows = [
        iteration(0, 0, 0.0),
        iteration(1, 1, 1.0, is_mean=1.0, is_max=1.2, is_truncated_frac=0.0, ess=0.99, is_applied=0.0),
        {"iteration": 2, "pipeline/syncs": 1.0, "eval/success_rate": 0.5},  # the final evaluation's line
    ]
    summary = offpolicy_summary(rows)
    assert summary["syncs"] == 3 and summary["is_applied"] is False
    assert "(measured, not applied: the policy loss ignores them)" in offpolicy_rows(summary, "async", 1)[1]
