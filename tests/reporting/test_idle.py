"""Where the hardware waits (``reporting.idle``): the idle shares of one iteration and of a run."""

from __future__ import annotations

import pytest

from selective_rollout.reporting.idle import engine_busy_delta, idle_metrics, throughput_summary


def test_a_replacement_engine_counts_from_zero() -> None:
    before = {"a": 10.0, "b": 4.0}
    after = {"a": 16.0, "c": 3.0}  # b died and was replaced by c mid-iteration
    assert engine_busy_delta(before, after) == pytest.approx(6.0 + 3.0)


def test_a_synchronous_iteration_shows_both_sides_waiting() -> None:
    # two engines busy 30 s each of a 100 s iteration whose learner step took 20 s
    m = idle_metrics(engine_busy_s=60.0, engines=2, learner_busy_s=20.0, iteration_s=100.0)
    assert m["system/engine_wait_frac"] == pytest.approx(0.7)
    assert m["system/learner_wait_frac"] == pytest.approx(0.8)
    assert idle_metrics(0.0, 2, 0.0, 0.0) == {}


def test_the_run_pools_its_iterations_by_their_seconds() -> None:
    rows = [
        {"iteration": -1, "eval/success_rate": 0.5},  # an evaluation line carries no idle figures
        {
            "iteration": 0,
            **idle_metrics(90.0, 1, 10.0, 100.0),
            "system/iteration_s": 100.0,
            "train/tokens": 500.0,
        },
        {"iteration": 1, **idle_metrics(10.0, 1, 40.0, 50.0), "system/iteration_s": 50.0},
    ]
    summary = throughput_summary(rows, informative_trained=3, wall_s=150.0)
    assert summary == pytest.approx(
        {
            "engine_wait_frac": 1 - 100.0 / 150.0,
            "learner_wait_frac": 1 - 50.0 / 150.0,
            "informative_groups_per_hour": 3 / (150.0 / 3600.0),
            "trained_tokens_per_engine_s": 500.0 / 150.0,
            "learner_step_s": (10.0 + 40.0) / 2,
            "trained_tokens_per_iteration": 500.0 / 2,
        }
    )
    assert throughput_summary(rows[:1], 3, 150.0) is None  # a log from before the idle figures


def test_the_run_report_says_who_waited_and_what_was_delivered(tmp_path) -> None:
    import json

    from selective_rollout.analysis.report import write_report

    row = {
        "iteration": 0,
        **idle_metrics(60.0, 2, 20.0, 100.0),
        "system/iteration_s": 100.0,
        "train/tokens": 900.0,
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    report = write_report(tmp_path, {"iteration": 1, "wall_s": 100.0}, regime_k=4).read_text()
    assert "| hardware waiting | engines 70% of their time (no request in flight), learners 80%" in report
    assert (
        "0.0 informative groups trained per hour of iterations; 4.5 trained tokens per engine-second"
        in report
    )
    assert "| learner | 20.0 s a step, 900 trained tokens per iteration |" in report
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "rollout/wall_s": 1.0}) + "\n")
    assert (
        "| hardware waiting | not recorded"
        in write_report(tmp_path, {"iteration": 1}, regime_k=4).read_text()
    )
