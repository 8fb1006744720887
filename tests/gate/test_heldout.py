"""The held-out evaluation: parts never share a task, each gate calibrated on the fit part only."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from selective_rollout.gate.offline.heldout import GateSpec, main, run, split_by_task
from selective_rollout.records import GroupWriter
from selective_rollout.stats import cluster_bootstrap_ci
from tests.gate.synthetic import converged, divergent, group, mixed_log


def test_task_split_never_shares_a_task_and_evaluates_every_group_once() -> None:
    log = mixed_log(seed=2, tasks=20, reps=2)
    parts = split_by_task(log, folds=3, seed=0)
    assert len(parts) == 3
    for fit, ev in parts:
        assert not {g.task_id for g in fit} & {g.task_id for g in ev}
        assert [g.group_id for g in ev] == [g.group_id for g in log if g in ev]  # log order kept
    assert sorted(g.group_id for _, ev in parts for g in ev) == sorted(g.group_id for g in log)


def test_calibration_uses_only_the_fit_part() -> None:
    """On the fit part converged groups are zero-variance, so tau opens; on the evaluation part
    they are mixed. A gate calibrated on the evaluation part would never stop there; held out,
    it stops and is wrong every time, and the table says so."""
    fit = [converged(f"f{i}", [0] * 4) for i in range(10)] + [
        divergent(f"d{i}", [1, 0, 1, 0]) for i in range(10)
    ]
    ev = [converged(f"e{i}", [1, 0, 0, 0]) for i in range(5)]
    (result, oracle) = run([(fit, ev)], [GateSpec("prefix_edit", 3)], [0.9], k=3, resamples=50)
    assert result.params[0]["tau"] > 0.0 and result.fit[0]["precision"] == 1.0
    assert result.summary["stops"] == 5 and result.summary["precision"] == 0.0
    assert oracle.spec.name == "oracle" and oracle.summary["stops"] == 0


def test_a_gate_that_calibrates_its_step_is_scored_against_the_oracle_at_the_evaluations_k() -> None:
    """stalled picks a later step on the fit part (its late winners finish at 8); the share of the
    oracle is still the share of what cutting the zero-variance groups at K = 4 would save."""
    long = [f"a{s}" for s in range(10)]

    def log(tag: str) -> list:
        fails = [group(f"{tag}f{i}", [long] * 4, [0, 0, 0, 0]) for i in range(6)]
        late = [group(f"{tag}m{i}", [long[:8], long, long, long], [1, 0, 0, 0]) for i in range(3)]
        return fails + late

    (result, oracle) = run([(log("fit"), log("ev"))], [GateSpec("stalled", 4)], [0.9], k=4, resamples=50)
    assert result.params[0] == {"k": 8, "max_finished_frac": 0.0}
    assert result.summary["precision"] == 1.0 and result.summary["stops"] == 6
    # 6 all-fail groups: stalled saves steps 9-10 of each, the K = 4 oracle steps 5-10
    assert result.summary["share_of_oracle"] == pytest.approx(2 / 6)
    assert oracle.summary["saved"] == pytest.approx(result.summary["saved"] * 3)


def test_cluster_bootstrap_resamples_whole_tasks() -> None:
    # two tasks: one always hits, one always misses; the ratio of sums swings between them
    clusters = [np.array([[1.0, 1.0]] * 3), np.array([[1.0, 0.0]] * 3)]
    lo, hi = cluster_bootstrap_ci(clusters, lambda s: s[:, 1].sum() / s[:, 0].sum(), resamples=500)
    assert lo == 0.0 and hi == 1.0  # a resample can draw the same task twice
    assert math.isnan(cluster_bootstrap_ci([], lambda s: 0.0)[0])


def test_cli_writes_the_table_and_refuses_overlapping_logs(tmp_path, capsys) -> None:
    log = tmp_path / "rollouts.jsonl"
    with GroupWriter(log) as w:
        for g in mixed_log(seed=3, tasks=24, reps=2):
            w.write(g)
    out = tmp_path / "heldout"
    argv = ["--rollouts", str(log), "--k", "4", "--steps", "6", "--targets", "0.9", "--out", str(out)]
    assert main([*argv, "--resamples", "50"]) == 0
    printed = capsys.readouterr().out
    for gate in ("prefix_edit", "learned", "history", "precision_target", "learned@4,6", "oracle"):
        assert f"| {gate} |" in printed
    rows = {r["gate"]: r for r in csv.DictReader((out / "heldout.csv").open())}
    assert float(rows["oracle"]["precision"]) == 1.0 and float(rows["oracle"]["share_of_oracle"]) == 1.0
    hist = rows["history"]
    assert float(hist["saved_lo"]) <= float(hist["saved"]) <= float(hist["saved_hi"])
    assert (out / "heldout_pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "heldout.md").read_text().splitlines()[3].startswith("| gate |")
    assert main(["--fit", str(log), "--eval", str(log), "--k", "4", "--out", str(out)]) == 2
    assert "never evaluate on a fit log" in capsys.readouterr().err
    assert main(["--rollouts", str(log), "--fit", str(log), "--out", str(out)]) == 2


@pytest.mark.parametrize("gates", ["oracle", "nosuch"])
def test_cli_names_a_bad_gate(tmp_path, capsys, gates) -> None:
    log = tmp_path / "rollouts.jsonl"
    with GroupWriter(log) as w:
        for g in mixed_log(seed=3, tasks=6, reps=1):
            w.write(g)
    assert main(["--rollouts", str(log), "--gates", gates, "--k", "4", "--out", str(tmp_path / "o")]) == 2
    assert gates in capsys.readouterr().err
