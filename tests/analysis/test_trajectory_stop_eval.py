"""The offline evaluation of a trajectory stop rule on small logs whose figures are worked out by hand.

Every step costs 100 step-tokens (tests/gate/synthetic.py). With ``outlived`` from step 3:

- group A (4 trajectories): 0 wins at step 3; 1 wins at step 8 (a late winner); 2 and 3 fail after
  10 steps. At step 3 trajectory 0 has won, so 1, 2 and 3 are stopped there with reward 0: 1's
  label is wrong (it saves 5 x 100), 2's and 3's right (7 x 100 each).
- group B (2): both fail after 10 steps; nobody wins, nothing is stopped.
- group C (2): 0 wins at step 2; 1 fails after 10 and is stopped at step 3, rightly (700).
- group D (2): 0 wins at step 7; 1 fails after 10 and is stopped at step 7, rightly (300).

In all 8,000 step-tokens (3,100 + 2,000 + 1,200 + 1,700); the rule stops 5 trajectories, 4 rightly,
and saves 1,900 + 700 + 300 = 2,900.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from selective_rollout.analysis.trajectory_stop_eval import first_stop, main, stops_in, summarize
from selective_rollout.records import GroupWriter, TrajectoryStatus, TrajectoryStop
from selective_rollout.stats import clopper_pearson
from selective_rollout.trajectory_stop.outlived import OutlivedRule
from tests.fixtures.output import own_lines
from tests.gate.synthetic import group


def _walk(tag: str, n: int) -> list[str]:
    return [f"{tag} {s}" for s in range(n)]


def _a(task: str = "a"):
    acts = [_walk("a0", 3), _walk("a1", 8), _walk("a2", 10), _walk("a3", 10)]
    return group(task, acts, [1.0, 1.0, 0.0, 0.0])


def _log():
    return [
        _a(),
        group("b", [_walk("b0", 10), _walk("b1", 10)], [0.0, 0.0]),
        group("c", [_walk("c0", 2), _walk("c1", 10)], [1.0, 0.0]),
        group("d", [_walk("d0", 7), _walk("d1", 10)], [1.0, 0.0]),
    ]


def _write(tmp_path, groups, name="r.jsonl"):
    path = tmp_path / name
    with GroupWriter(path) as w:
        for g in groups:
            w.write(g)
    return path


def _rows(out):
    with (out / "trajectory_stops.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_first_stop_sees_the_group_in_lock_step() -> None:
    rule = OutlivedRule(min_step=3)
    a = _a()
    assert [first_stop(rule, a, i) for i in range(4)] == [None, (3, 0.0), (3, 0.0), (3, 0.0)]
    d = _log()[3]
    assert first_stop(rule, d, 1) == (7, 0.0)  # its sibling's win at step 7 is seen at step 7, not before
    assert first_stop(OutlivedRule(min_step=8), a, 1) is None  # 1 ended at step 8: never asked there


def test_precision_saving_and_the_advantages_a_wrong_label_gives() -> None:
    s = summarize(stops_in(OutlivedRule(min_step=3), _log()))
    assert (s["stopped"], s["right"], s["precision"]) == (5, 4, 0.8)
    assert (s["precision_lo"], s["precision_hi"]) == pytest.approx(clopper_pearson(4, 5))
    assert s["saved"] == pytest.approx(2900 / 8000)
    # A's true rewards [1, 1, 0, 0] give advantages +-sqrt(3)/2; with the late winner labelled 0 the
    # learner gets [1, 0, 0, 0]: mean 1/4, sample std 1/2, advantages [1.5, -0.5, -0.5, -0.5]
    half = math.sqrt(3) / 2
    error = np.linalg.norm([1.5 - half, -0.5 - half, -0.5 + half, -0.5 + half])
    assert s["wrong_groups"] == 1 and s["adv_l2_error"] == pytest.approx(error, rel=1e-5)
    assert s["sign_flips"] == 1  # the late winner's advantage turns negative


def test_the_cli_reports_the_rule_and_its_saving_on_top_of_the_gate(tmp_path) -> None:
    """stalled at step 5 cuts B (nobody finished by 5: it saves 2 x 5 x 100) and D (its winner
    finished at 7: 2 x 100 + 5 x 100): the rule's stop in D is left out, its saving on top of the
    gate is A's and C's, 2,600 of the 8,000."""
    out = tmp_path / "out"
    path = _write(tmp_path, _log())
    args = ["--rollouts", str(path), "--rule", "outlived", "--param", "min_step=3", "--out", str(out)]
    assert main([*args, "--gate", "stalled", "--gate-k", "5"]) == 0
    (row,) = _rows(out)
    assert row["setting"] == "min_step=3"
    assert float(row["stopped"]) == 5 and float(row["saved"]) == pytest.approx(2900 / 8000, abs=1e-6)
    assert float(row["gate_cut"]) == 2
    assert (float(row["kept_stopped"]), float(row["kept_right"])) == (4, 3)
    assert float(row["kept_saved"]) == pytest.approx(2600 / 8000, abs=1e-6)
    text = (out / "trajectory_stops.md").read_text()
    assert "cuts 2 of them and saves 21.2% of their step-tokens" in text  # 1,700 of 8,000
    assert "| min_step=3 | 5 (4) | 0.80 [" in text and "| 36.2% | 1 |" in text


def test_the_grid_is_chosen_on_other_tasks_and_evaluated_held_out(tmp_path) -> None:
    """Four A-like tasks: from step 3 one stop in three is wrong (the late winner), from step 9 every
    stop is right (the late winner ended at 8), so each fold chooses min_step=9 at a 0.95 target,
    which stops each group's two failures at step 9 (100 step-tokens each) on the held-out tasks."""
    out = tmp_path / "out"
    path = _write(tmp_path, [_a(f"a{n}") for n in range(4)])
    args = ["--rollouts", str(path), "--rule", "outlived", "--grid", "min_step=3,9", "--out", str(out)]
    assert main(args) == 0
    rows = {r["setting"]: r for r in _rows(out)}
    assert float(rows["min_step=3"]["precision"]) == pytest.approx(2 / 3, abs=1e-6)
    assert float(rows["min_step=9"]["precision"]) == 1.0
    (held,) = [r for s, r in rows.items() if s.startswith("held out")]
    assert held["setting"] == "held out, chosen per fold: min_step=9; min_step=9"
    assert (float(held["stopped"]), float(held["right"])) == (8, 8)
    assert float(held["saved"]) == pytest.approx(800 / 12400, abs=1e-6)
    # at a setting no fold can trust, the rule stays off where it is evaluated
    assert main([*args[:-4], "--grid", "min_step=3,4", "--out", str(out)]) == 0
    held = _rows(out)[-1]
    assert held["setting"].endswith(
        "no setting reaches the target: no stop; no setting reaches the target: no stop"
    )
    assert float(held["stopped"]) == 0 and float(held["saved"]) == 0


def test_groups_holding_an_assigned_reward_are_left_out(tmp_path) -> None:
    stopped = _log()[2]
    stopped.trajectories[1].status = TrajectoryStatus.STOPPED
    stopped.trajectories[1].stop = TrajectoryStop(3, 0.0, "outlived")
    out = tmp_path / "out"
    path = _write(tmp_path, [_log()[0], stopped])
    assert (
        main(["--rollouts", str(path), "--rule", "outlived", "--param", "min_step=3", "--out", str(out)]) == 0
    )
    (row,) = _rows(out)
    assert float(row["groups"]) == 1 and float(row["stopped"]) == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rule", "outlivd"], "unknown trajectory stop 'outlivd' (did you mean 'outlived'?)"),
        (["--rule", "outlived", "--param", "window=3"], "has no parameter 'window'"),
        (["--rule", "outlived", "--grid", "min_step=0,3"], "min_step must be >= 1 (got '0')"),
    ],
)
def test_a_bad_rule_or_parameter_is_one_error_line(tmp_path, capsys, extra, message) -> None:
    path = _write(tmp_path, _log())
    assert main(["--rollouts", str(path), *extra, "--out", str(tmp_path / "out")]) == 2
    (line,) = own_lines(capsys.readouterr().err)
    assert message in line
