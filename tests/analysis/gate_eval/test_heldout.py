"""The held-out evaluation: parts never share a task, each gate calibrated on the fit part only."""

from __future__ import annotations

import csv
import dataclasses
import math

import numpy as np
import pytest

from selective_rollout.analysis.gate_eval.heldout import (
    GateSpec,
    episode_cap,
    main,
    run,
    split_by_task,
    table,
)
from selective_rollout.analysis.gate_eval.paper_reference import POINTS, nearest
from selective_rollout.records import GroupRecord, GroupWriter, TrajectoryStatus
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


def late_winners(tag: str) -> list[GroupRecord]:
    """Six all-fail groups of 10 steps and three whose one winner finishes at step 8."""
    long = [f"a{s}" for s in range(10)]
    fails = [group(f"{tag}f{i}", [long] * 4, [0, 0, 0, 0]) for i in range(6)]
    late = [group(f"{tag}m{i}", [long[:8], long, long, long], [1, 0, 0, 0]) for i in range(3)]
    return fails + late


def test_a_gate_that_calibrates_its_step_is_scored_against_the_oracle_at_the_evaluations_k() -> None:
    """stalled picks a later step on the fit part (its late winners finish at 8); the share of the
    oracle is still the share of what cutting the zero-variance groups at K = 4 would save."""
    parts = [(late_winners("fit"), late_winners("ev"))]
    (result, oracle) = run(parts, [GateSpec("stalled", 4)], [0.9], k=4, resamples=50)
    assert result.params[0] == {"k": 8, "max_finished_frac": 0.0}
    assert result.summary["precision"] == 1.0 and result.summary["stops"] == 6
    # 6 all-fail groups: stalled saves steps 9-10 of each, the K = 4 oracle steps 5-10
    assert result.summary["share_of_oracle"] == pytest.approx(2 / 6)
    assert oracle.summary["saved"] == pytest.approx(result.summary["saved"] * 3)
    # every saving came from all-fail groups; the row says so beside what the oracle took there
    head, rule, row = table([result], horizon=10)
    assert "saved from all-fail / all-succeed groups (the oracle's at K)" in head
    assert row.count("|") == head.count("|") == rule.count("|")
    fail = result.summary["saved"]
    assert f"| {fail:.1%} / 0.0% ({3 * fail:.1%} / 0.0%) |" in row


def test_a_row_gives_the_step_its_gate_calibrated_as_k_over_t_beside_the_paper_there() -> None:
    """stalled decides at its own step 8, the oracle at K = 4: of a 10-step cap, K/T 0.8 and 0.4,
    where the paper's nearest points are K = 25 and K = 12 of 30."""
    parts = [(late_winners("fit"), late_winners("ev"))]
    (result, oracle) = run(parts, [GateSpec("stalled", 4)], [0.9], k=4, resamples=50)
    assert result.steps == [(8,)] and oracle.steps == [(4,)]
    stalled_row, oracle_row = table([result, oracle], horizon=10)[2:]
    assert "| 8 (0.80) |" in stalled_row and "| K=25/30 (0.83): 2.8% at 0.89 |" in stalled_row
    assert "| 4 (0.40) |" in oracle_row and "| K=12/30 (0.40): 15.0% at 0.86 |" in oracle_row
    # folds that calibrated different steps: each fold's K/T, and the paper at each
    (row,) = table([dataclasses.replace(result, steps=[(8,), (11,), (8,)])], horizon=20)[2:]
    assert "| 8 (0.40); 11 (0.55) |" in row
    assert "| K=12/30 (0.40): 15.0% at 0.86; K=15/30 (0.50): 12.5% at 0.83 |" in row


def test_the_paper_point_at_a_k_over_t_is_the_nearest_reported_one() -> None:
    assert [p.k for p in POINTS] == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 25]
    at = nearest(4, 10)  # K/T 0.4 = K 12 of 30
    assert (at.k, at.k_over_t, at.saved, at.precision, at.recall) == (12, 0.4, 0.150, 0.86, 0.64)
    assert nearest(12, 30) == at and nearest(12, 31) == at  # 11.6 of 30
    assert nearest(2, 10).k == 6 and nearest(2, 10).precision is None and nearest(2, 10).saved == 0.0
    assert nearest(7, 12).k == 15  # halfway between 15 and 20 of 30: the earlier
    assert nearest(1, 30).k == 5 and nearest(30, 30).k == 25  # outside the reported steps: the end


def test_the_episode_cap_is_read_from_truncated_trajectories_else_the_longest() -> None:
    groups = [converged("a", [0, 0], length=6), converged("b", [1, 0], length=9)]
    assert episode_cap(groups)[0] == 9
    groups[0].trajectories[0].status = TrajectoryStatus.TRUNCATED
    assert episode_cap(groups) == (6, "the length of the logs' truncated trajectories")
    groups[1].trajectories[0].status = TrajectoryStatus.TRUNCATED
    with pytest.raises(ValueError, match="--horizon"):
        episode_cap(groups)


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
    # the logs' trajectories run 12 steps, none truncated: T = 12, K/T 4/12, the paper's K = 10 of 30
    assert {k: hist[k] for k in ("horizon", "steps", "k_over_t", "paper_k")} == {
        "horizon": "12",
        "steps": "4",
        "k_over_t": "0.3333",
        "paper_k": "10",
    }
    assert (hist["paper_saved"], hist["paper_precision"]) == ("0.133", "0.8")
    assert rows["learned@4,6"]["k_over_t"] == "0.3333, 0.5" and rows["learned@4,6"]["paper_k"] == "10;15"
    assert (out / "heldout_pareto.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "heldout.md").read_text()
    assert md.splitlines()[3].startswith("| gate |") and "K=4 of T=12 steps" in md
    assert "| history | 0.9 |" in md and "| 4 (0.33) |" in md and "| K=10/30 (0.33): 13.3% at 0.80 |" in md
    assert "arXiv 2605.05802" in md
    assert (
        "| K/T | 0.17 | 0.20 | 0.23 | 0.27 | 0.30 | 0.33 | 0.37 | 0.40 | 0.43 | 0.47 | 0.50 | 0.67 | 0.83 |"
        in md
    )
    assert (
        "| precision | - | - | - | - | 0.82 | 0.80 | 0.80 | 0.86 | 0.84 | 0.84 | 0.83 | 0.83 | 0.89 |" in md
    )
    assert main(["--fit", str(log), "--eval", str(log), "--k", "4", "--out", str(out)]) == 2
    assert "never evaluate on a fit log" in capsys.readouterr().err
    assert main(["--rollouts", str(log), "--fit", str(log), "--out", str(out)]) == 2


def test_cli_horizon_sets_the_cap_of_k_over_t(tmp_path, capsys) -> None:
    log = tmp_path / "rollouts.jsonl"
    with GroupWriter(log) as w:
        for g in mixed_log(seed=3, tasks=6, reps=1):
            w.write(g)
    argv = ["--rollouts", str(log), "--gates", "prefix_edit", "--k", "4", "--out", str(tmp_path / "o")]
    assert main([*argv, "--horizon", "24", "--resamples", "20"]) == 0
    row = next(csv.DictReader((tmp_path / "o" / "heldout.csv").open()))
    assert (row["horizon"], row["k_over_t"], row["paper_k"], row["paper_precision"]) == (
        "24",
        "0.1667",
        "5",
        "",
    )
    assert "T: --horizon" in capsys.readouterr().out
    assert main([*argv, "--horizon", "3"]) == 2
    assert "--horizon must be" in capsys.readouterr().err


@pytest.mark.parametrize("gates", ["oracle", "nosuch"])
def test_cli_names_a_bad_gate(tmp_path, capsys, gates) -> None:
    log = tmp_path / "rollouts.jsonl"
    with GroupWriter(log) as w:
        for g in mixed_log(seed=3, tasks=6, reps=1):
            w.write(g)
    assert main(["--rollouts", str(log), "--gates", gates, "--k", "4", "--out", str(tmp_path / "o")]) == 2
    assert gates in capsys.readouterr().err


def test_online_variants_take_the_calibrated_step_as_prior_and_a_composed_gate_lists_its_members() -> None:
    parts = [(late_winners("fit"), late_winners("ev"))]
    specs = [GateSpec("stalled", 4, online=(4, 9)), GateSpec("any", 4, online=(4, 9))]
    stalled, composed, _ = run(parts, specs, [0.9], k=4, resamples=50)
    assert stalled.spec.label == "stalled~online" and composed.spec.label == "any~online"
    assert stalled.params[0] == {
        "k": 8,
        "max_finished_frac": 0.0,
        "online": [4, 9],
        "target": 0.9,
        "steps_at_end": [8],  # 9 groups observed: too few to move the prior either way
    }
    assert stalled.summary["precision"] == 1.0 and stalled.summary["stops"] == 6
    member = next(m for m in composed.params[0]["members"] if m["name"] == "stalled")
    # the default member (step 11) searches from the evaluation's K = 4: the late winners put it at 8
    assert member["k"] == 8 and member["online"] == [4, 9]
    row = table([composed], horizon=10)[2]
    assert "members=[stalled@8 max_finished_frac=0 online, prefix_edit@4 tau=" in row


def test_an_online_variant_from_a_given_prior_fits_nothing_and_starts_knowing_nothing() -> None:
    parts = [(late_winners("fit"), late_winners("ev"))]
    (result, _) = run(parts, [GateSpec("stalled", 4, online=(4, 9), prior=6)], [0.9], k=4, resamples=50)
    assert result.spec.label == "stalled~online from 6"
    # step 6 (the prior) cuts the late winners too: 6 of 9 right; 9 groups are too few to move it
    assert result.params[0]["k"] == 6 and result.params[0]["steps_at_end"] == [6]
    assert result.summary["stops"] == 9 and result.summary["precision"] == pytest.approx(6 / 9)
