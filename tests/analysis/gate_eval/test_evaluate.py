"""Offline gate evaluation CLI on a rollouts.jsonl the test writes."""

import csv
import json

import pytest

from selective_rollout.analysis.gate_eval.evaluate import main
from selective_rollout.records import GroupRecord, GroupWriter, Outcome, Step, Trajectory, TrajectoryStatus


def _group(
    gid: str, actions: list[list[str]], rewards: list[float], outcome=Outcome.COMPLETED
) -> GroupRecord:
    trajs = [
        Trajectory(
            index=i,
            steps=[Step(action=a, prompt_tokens=90, completion_tokens=10) for a in acts],
            reward=r,
            won=r > 0,
            status=TrajectoryStatus.FINISHED,
        )
        for i, (acts, r) in enumerate(zip(actions, rewards, strict=True))
    ]
    return GroupRecord(
        group_id=gid,
        task_id=f"task-{gid}",
        task_type="pick_and_place_simple",
        trajectories=trajs,
        outcome=outcome,
    )


def write_example(path) -> None:
    """4 converged zero-variance groups, 1 converged mixed group (a gate false positive), 3 divergent
    mixed groups, 1 divergent zero-variance group (a miss), and one cut group with no label."""
    same = [f"a{i}" for i in range(10)]
    with GroupWriter(path) as w:
        for n in range(4):
            w.write(_group(f"cz{n}", [same] * 4, [float(n % 2)] * 4))
        w.write(_group("cm", [same] * 4, [1, 0, 0, 0]))
        for n in range(3):
            w.write(_group(f"dm{n}", [[f"t{j}-{i}" for i in range(10)] for j in range(4)], [1, 1, 0, 0]))
        w.write(_group("dz", [[f"u{j}-{i}" for i in range(10)] for j in range(4)], [0, 0, 0, 0]))
        cut = _group("cut", [same[:5]] * 4, [0, 0, 0, 0], outcome=Outcome.CUT)
        for t in cut.trajectories:
            t.reward = None
        w.write(cut)


def _rows(out):
    with (out / "gate_eval.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_cli_writes_csv_and_png(tmp_path, capsys):
    rollouts = tmp_path / "rollouts.jsonl"
    write_example(rollouts)
    out = tmp_path / "eval"
    assert (
        main(["--rollouts", str(rollouts), "--out", str(out), "--k", "5,10", "--tau", "0.05:0.15:0.05"]) == 0
    )
    rows = _rows(out)
    png = out / "gate_pareto.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    row = next(r for r in rows if r["gate"] == "prefix_edit" and r["k"] == "5" and float(r["tau"]) == 0.1)
    # 9 labelled groups (the unaudited cut one has no label); 5 zero-variance
    assert (row["n_groups"], row["n_zero_var"]) == ("9", "5")
    # converged groups fire (4 TP + 1 FP); the divergent zero-variance one is missed
    assert (row["tp"], row["fp"], row["fn"], row["tn"]) == ("4", "1", "1", "3")
    assert float(row["precision"]) == pytest.approx(0.8)
    assert float(row["recall"]) == pytest.approx(0.8)
    # each group has 4 x 10 steps x 100 tokens; a cut at K=5 saves half of a group
    assert float(row["tokens_saved_frac"]) == pytest.approx(5 * 0.5 / 9, abs=1e-5)
    oracle = next(r for r in rows if r["gate"] == "oracle" and r["k"] == "5")
    assert float(oracle["tokens_saved_frac"]) == pytest.approx(5 * 0.5 / 9, abs=1e-5)
    assert float(row["frac_of_oracle"]) == pytest.approx(1.0)
    # the false positive loses the advantage of one of four mixed groups
    assert float(row["adv_l2_preserved"]) == pytest.approx((3 / 4) ** 0.5, abs=1e-4)
    # D_K separates the classes imperfectly: informative groups have higher distance
    assert 0.5 < float(row["auroc"]) < 1.0
    # at K = 10 every trajectory has already ended: as online, the gate is never consulted
    late = next(r for r in rows if r["gate"] == "prefix_edit" and r["k"] == "10" and float(r["tau"]) == 0.1)
    assert (late["tp"], late["fp"], late["tokens_saved_frac"]) == ("0", "0", "0.0")
    assert "groups (5 zero-variance)" in capsys.readouterr().out


def test_cli_reports_missing_and_empty_inputs(tmp_path, capsys):
    assert main(["--rollouts", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"group_id": "x"}) + "\n" + "{}\n")
    assert main(["--rollouts", str(bad), "--out", str(tmp_path)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_cli_rejects_bad_grid(tmp_path):
    with pytest.raises(SystemExit):
        main(["--rollouts", "x", "--out", str(tmp_path), "--tau", "0.1:2:0.5"])
    with pytest.raises(SystemExit):
        main(["--rollouts", "x", "--out", str(tmp_path), "--k", "0"])


def test_the_sweep_splits_recall_into_all_fail_and_all_succeed_groups(tmp_path):
    log = tmp_path / "rollouts.jsonl"
    write_example(log)
    out = tmp_path / "eval"
    assert main(["--rollouts", str(log), "--out", str(out), "--k", "5", "--tau", "0.1:0.1:0.1"]) == 0
    row = next(r for r in _rows(out) if r["gate"] == "prefix_edit")
    # the converged groups are stopped: two of the three all-fail ones (the divergent one is
    # missed) and both all-succeed ones
    assert float(row["recall_all_fail"]) == pytest.approx(2 / 3)
    assert float(row["recall_all_succeed"]) == 1.0
