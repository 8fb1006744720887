"""The experiment runner: paired differences with bootstrap CIs, outputs, and a tiny real run."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path

import pytest

from selective_rollout.analysis.experiment import (
    ExperimentConfig,
    arm_metrics,
    held_out_changes,
    load_experiment,
    paired_cut_precision,
    paired_differences,
    pooled_held_out,
    versus_section,
    write_outputs,
)
from selective_rollout.config import ConfigError
from selective_rollout.records import GroupRecord, GroupWriter, Outcome, Step, Trajectory


def _rows():
    rows = []
    for seed, (off, on) in enumerate([(100.0, 90.0), (120.0, 105.0), (110.0, 99.0)]):
        rows.append(
            {
                "arm": "off",
                "seed": seed,
                "wall_s": off,
                "step_tokens": 1000,
                "groups_cut": 0,
                "audit_precision": None,
                "zero_var_frac": 0.4,
                "success_before": 0.2,
                "success_after": 0.3,
            }
        )
        rows.append(
            {
                "arm": "on",
                "seed": seed,
                "wall_s": on,
                "step_tokens": 880,
                "groups_cut": 3,
                "audit_precision": 1.0,
                "zero_var_frac": 0.4,
                "success_before": 0.2,
                "success_after": 0.35,
            }
        )
    return rows


def test_paired_differences_are_per_seed():
    diffs = {d["metric"]: d for d in paired_differences(_rows(), ["off", "on"], 500)}
    wall = diffs["wall_s"]
    assert wall["mean_diff"] == pytest.approx(-12.0)  # mean of -10, -15, -11
    assert wall["ci_low"] <= -12.0 <= wall["ci_high"] and wall["ci_low"] >= -15 and wall["ci_high"] <= -10
    assert wall["rel"] == pytest.approx(-12.0 / 110.0)
    assert diffs["step_tokens"]["mean_diff"] == -120 and diffs["step_tokens"]["ci_low"] == -120
    assert "audit_precision" not in diffs  # undefined for the reference arm: no difference reported


def test_a_change_metric_has_no_relative_difference():
    # the reference's held-out change is itself signed: +0.125 over -0.083 would read "-150%"
    rows = [
        {"arm": "off", "seed": 0, "success_gain": 0.0833, "success_gain_ci_low": -0.0833, "wall_s": 100.0},
        {"arm": "on", "seed": 0, "success_gain": 0.1667, "success_gain_ci_low": 0.0417, "wall_s": 90.0},
    ]
    diffs = {d["metric"]: d for d in paired_differences(rows, ["off", "on"], 100)}
    assert diffs["success_gain_ci_low"]["mean_diff"] == pytest.approx(0.125)
    assert diffs["success_gain"]["rel"] is None and diffs["success_gain_ci_low"]["rel"] is None
    assert diffs["wall_s"]["rel"] == pytest.approx(-0.1)
    # a sync run's loss sits at zero (its ratio is exactly 1): 0.009 over 3e-8 is no relative change
    rows = [
        {"arm": "sync", "seed": 0, "loss_abs_max": 3e-8},
        {"arm": "async", "seed": 0, "loss_abs_max": 0.009},
    ]
    assert paired_differences(rows, ["sync", "async"], 100)[0]["rel"] is None


def test_outputs_are_written(tmp_path):
    exp = ExperimentConfig(base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1, 2])
    write_outputs(tmp_path, exp, _rows())
    with (tmp_path / "experiment.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 6
    md = (tmp_path / "experiment.md").read_text()
    assert "| on | wall-clock (s) | -12 |" in md and "95% CI" in md
    assert (tmp_path / "experiment.png").read_bytes()[:4] == b"\x89PNG"


def test_a_difference_over_one_seed_has_no_ci(tmp_path):
    rows = _rows()
    for r in rows:
        r["rollout_s_per_informative"] = 10.0 if r["seed"] == 0 else None
    exp = ExperimentConfig(base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1, 2])
    write_outputs(tmp_path, exp, rows)
    lines = (tmp_path / "experiment.md").read_text().splitlines()
    line = next(ln for ln in lines if ln.startswith("| on | rollout s per"))
    assert "n/a (1 seed)" in line and line.endswith("| 1 |")


def test_the_report_says_how_many_seeds_the_cost_per_informative_group_would_take(tmp_path):
    rows = _rows()
    cost = {("off", 0): 100.0, ("off", 1): 100.0, ("off", 2): 100.0, ("on", 0): 70.0, ("on", 1): 90.0}
    for r in rows:
        r["step_tokens_per_informative"] = cost.get((r["arm"], r["seed"]), 80.0)
    exp = ExperimentConfig(
        base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1, 2], aimed_change=0.1
    )
    write_outputs(tmp_path, exp, rows)
    md = (tmp_path / "experiment.md").read_text()
    assert "## Seeds the cost per informative group would take (vs `off`)" in md
    # differences -30, -10, -20 (SD 10): at -20, (1.96 x 10 / 20)^2 -> 2 seeds (the fewest a CI
    # takes), (2.80 x 10 / 20)^2 -> 2; at the aimed 10% change: 4 / 8
    line = next(
        ln for ln in md.splitlines() if ln.startswith("| on | step-tokens per informative group | -20.0%")
    )
    assert line == "| on | step-tokens per informative group | -20.0% | 10.0% | 3 | 2 / 2 | 4 / 8 |"
    assert "seeds at a 10% change" in md
    # rollout seconds per informative group were not recorded: no line, not a line of n/a
    assert "| on | rollout s per informative group |" not in md.split("## Seeds the cost")[1]


def test_a_relative_difference_divides_by_the_reference_on_the_same_seeds(tmp_path):
    """A seed only the reference has a figure for (the arm kept no informative group) is left out
    of the base too, or the relative change would describe other runs than the differences."""
    rows = _rows()
    cost = {("off", 0): 100.0, ("off", 1): 100.0, ("off", 2): 1000.0, ("on", 0): 70.0, ("on", 1): 90.0}
    for r in rows:
        r["step_tokens_per_informative"] = cost.get((r["arm"], r["seed"]))
    diffs = {d["metric"]: d for d in paired_differences(rows, ["off", "on"], 200)}
    assert diffs["step_tokens_per_informative"]["rel"] == pytest.approx(-0.2)
    exp = ExperimentConfig(base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1, 2])
    write_outputs(tmp_path, exp, rows)
    assert (
        "| on | step-tokens per informative group | -20.0% | 14.1% | 2 |"
        in (tmp_path / "experiment.md").read_text()
    )


def _report(tmp_path: Path, **rollout) -> Path:
    """A run folder whose report.json holds what ``arm_metrics`` reads, plus ``rollout`` keys."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    base = {"step_tokens_spent": 1000, "outcomes": {"cut": 1}, "kept": 4, "informative_kept": 2}
    base |= {"audit_precision": None, "audited": 0, "zero_var_frac": 0.5}
    report = {"wall_s": 10.0, "rollout_wall_s": 8.0, "rollout": base | rollout, "eval": {}, "iterations": 2}
    (run / "report.json").write_text(json.dumps(report))
    return run


def test_the_training_curve_and_importance_weights_are_arm_metrics(tmp_path):
    """What learning parity compares besides the held-out change: training success, the largest
    loss and gradient, and the share of stale tokens whose importance weight stayed within the cap."""
    run = _report(tmp_path / "async")
    report = json.loads((run / "report.json").read_text())
    report["pipeline"] = {"kind": "async", "is_truncated_frac": 0.004, "ess_min": 0.97}
    (run / "report.json").write_text(json.dumps(report))
    curve = [
        {"iteration": -1, "eval/success_rate": 0.5},  # the held-out evaluation before training
        {"iteration": 0, "rollout/success_rate": 0.25, "train/loss": -0.5, "train/grad_norm": 2.0},
        {"iteration": 1, "rollout/success_rate": 0.75},  # no informative group: no learner step
        {"iteration": 2, "rollout/success_rate": 0.5, "train/loss": 0.25, "train/grad_norm": 3.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in curve))
    metrics = arm_metrics(run)
    assert metrics["train_success"] == 0.5 and metrics["train_success_last"] == 0.5
    assert (metrics["loss_abs_max"], metrics["grad_norm_max"]) == (0.5, 3.0)
    assert metrics["is_within_cap"] == pytest.approx(0.996) and metrics["ess_min"] == 0.97
    sync = arm_metrics(_report(tmp_path / "sync"))  # no stale token: no importance weight at all
    assert sync["is_within_cap"] is None and sync["train_success"] is None


def test_trajectory_stops_and_their_audited_label_precision_are_arm_metrics(tmp_path):
    stops = {"stopped": 7, "audited": 4, "label_right": 3}
    metrics = arm_metrics(_report(tmp_path, trajectory_stops=stops))
    assert metrics["trajectories_stopped"] == 7 and metrics["trajectory_label_precision"] == 0.75
    assert metrics["step_tokens_per_informative"] == 500
    unaudited = arm_metrics(_report(tmp_path / "x", trajectory_stops={"stopped": 2, "audited": 0}))
    assert unaudited["trajectory_label_precision"] is None  # no audit: unknown, not 0
    older = arm_metrics(_report(tmp_path / "y"))  # a report from before trajectory stops
    assert older["trajectories_stopped"] == 0 and older["trajectory_label_precision"] is None


def test_an_arms_audited_precision_pools_its_seeds_audits(tmp_path):
    """One seed's single wrong audit must not weigh as much as another seed's ten right ones."""
    rows = _rows()[:4]  # seeds 0 and 1 of both arms
    counts = {("on", 0): (1, 0), ("on", 1): (10, 10)}
    for r in rows:
        audits, right = counts.get((r["arm"], r["seed"]), (0, 0))
        r.update(audits=audits, audits_right=right, audit_precision=right / audits if audits else None)
        r.update(trajectory_stops_audited=0, trajectory_labels_right=0)
    exp = ExperimentConfig(base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1])
    write_outputs(tmp_path, exp, rows)
    line = next(
        ln for ln in (tmp_path / "experiment.md").read_text().splitlines() if ln.startswith("| on | ")
    )
    assert "| 0.909 (10 of 11) |" in line  # pooled; the seeds' mean would read 0.5
    with (tmp_path / "experiment.csv").open() as fh:
        assert {r["audits"] for r in csv.DictReader(fh) if r["arm"] == "on"} == {"1", "10"}


def _held_out() -> dict[str, dict[int, dict[str, float]]]:
    """arm -> seed -> task -> change: 'on' gains 0.25 on every task of both seeds, 'off' 0 or 0.5."""
    tasks = [f"t{i}" for i in range(6)]
    return {
        "off": {s: {t: 0.5 * (i % 2) for i, t in enumerate(tasks)} for s in (0, 1)},
        "on": {s: dict.fromkeys(tasks, 0.25) for s in (0, 1)},
    }


def _report_evals(changes: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict[int, dict]]:
    """The runs' report ``eval`` sections (4 tries) whose per-task changes are ``changes``."""
    return {
        arm: {
            s: {
                "tries": 4,
                "before": {"per_task": dict.fromkeys(c, 0.5)},
                "after": {"per_task": {t: 0.5 + v for t, v in c.items()}},
            }
            for s, c in runs.items()
        }
        for arm, runs in changes.items()
    }


def test_held_out_change_is_pooled_over_seeds_with_a_ci_over_tasks():
    off, on = pooled_held_out(_held_out(), "off", 500)
    assert (off["tasks"], off["pairs"]) == (6, 12) and off["mean"] == pytest.approx(0.25)
    assert off["ci95"][0] < 0.25 < off["ci95"][1] and off["ci95"][0] >= 0.0 and "vs_reference" not in off
    # the same change on every task: no spread to resample, the CI is the value
    assert on["mean"] == pytest.approx(0.25) and on["ci95"] == [pytest.approx(0.25)] * 2
    assert on["vs_reference"]["mean"] == pytest.approx(0.0) and on["vs_reference"]["pairs"] == 12
    assert on["vs_reference"]["ci95"][0] < 0.0 < on["vs_reference"]["ci95"][1]


def test_arms_named_in_versus_are_compared_with_every_other_arm(tmp_path):
    changes = _held_out() | {"drop": {s: dict.fromkeys([f"t{i}" for i in range(6)], 0.125) for s in (0, 1)}}
    lines = versus_section(changes, ["drop"], 500)
    assert lines[1].startswith("## Held-out change of each arm minus another's")
    rows = {ln.split(" | ")[0]: ln for ln in lines if ln.startswith("| ") and "minus |" not in ln}
    assert set(rows) == {"| off", "| on"}  # the arm itself is not compared with itself
    assert rows["| on"] == "| on | drop | +12.5% | [+12.5%, +12.5%] | 12 |"  # 0.25 - 0.125 on every task
    assert versus_section(changes, [], 500) == []
    with pytest.raises(ConfigError, match="versus names arms that are not in arms: dorp"):
        (tmp_path / "e.yaml").write_text("base: cpu_default.yaml\narms: {a: [], b: []}\nversus: [dorp]\n")
        load_experiment(tmp_path / "e.yaml")


def test_a_task_on_several_seeds_is_resampled_as_one():
    # one task gained on all four seeds and one lost on all four: a resample draws each task's
    # values together, so a quarter of the resamples hold only the loser and the CI reaches -0.5;
    # eight independent draws would all be losers once in 256, and the CI would stay inside
    seeds = range(4)
    changes = {"off": {s: {"a": 0.5, "b": -0.5} for s in seeds}}
    (row,) = pooled_held_out(changes, "off", 2000)
    assert (row["tasks"], row["pairs"], row["mean"]) == (2, 8, 0.0)
    assert row["ci95"] == [pytest.approx(-0.5), pytest.approx(0.5)]


def test_the_pooled_difference_does_not_depend_on_the_process_hash_seed():
    # the tasks two arms share were once taken in set order, which Python's per-process string
    # hashing reorders: the same finished runs then printed a CI bound of +1.6% or +1.4%
    import subprocess
    import sys

    snippet = (
        "from selective_rollout.analysis.experiment import pooled_held_out\n"
        "import random\n"
        "rng = random.Random(0)\n"
        "tasks = [f'task-{i}' for i in range(24)]\n"
        "changes = {a: {s: {t: rng.choice([-0.25, 0, 0.25, 0.5]) for t in tasks} for s in range(3)}"
        " for a in ('off', 'on')}\n"
        "print(pooled_held_out(changes, 'off', 500)[1]['vs_reference']['ci95'])\n"
    )
    printed = {
        subprocess.run(
            [sys.executable, "-c", snippet],
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in (1, 2, 3)
    }
    assert len(printed) == 1


def test_held_out_changes_are_read_per_task_from_a_report():
    evals = {"before": {"per_task": {"a": 0.25, "b": 0.5}}, "after": {"per_task": {"a": 0.75, "b": 0.5}}}
    assert held_out_changes(evals) == {"a": 0.5, "b": 0.0}
    assert held_out_changes({"before": evals["before"]}) == {}
    assert pooled_held_out({"off": {0: {}}}, "off", 100) == []  # no section for an unevaluated arm


def test_the_pooled_held_out_change_is_in_the_report(tmp_path):
    exp = ExperimentConfig(base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1])
    write_outputs(tmp_path, exp, [r for r in _rows() if r["seed"] < 2], _report_evals(_held_out()))
    md = (tmp_path / "experiment.md").read_text()
    assert "## Held-out change pooled over seeds" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| on | +25.0% |"))
    assert line.startswith("| on | +25.0% | [+25.0%, +25.0%] | +0.0% | [") and line.endswith("| 6 | 12 |")
    write_outputs(tmp_path, exp, _rows())
    assert "Held-out change pooled" not in (tmp_path / "experiment.md").read_text()


def _evals(wall_s: float | None) -> dict[str, dict[int, dict]]:
    """arm -> seed -> report eval section over 16 tasks x 4 tries: 'on' gains a quarter on half the
    tasks on both seeds, 'off' gains on seed 0 what it loses on seed 1."""
    tasks = [f"t{i}" for i in range(16)]
    before = {t: 0.25 + 0.25 * (i % 3) for i, t in enumerate(tasks)}
    after = {
        "off": {0: {t: before[t] + 0.25 for t in tasks}, 1: {t: before[t] - 0.25 for t in tasks}},
        "on": {s: {t: before[t] + 0.25 * (i % 2) for i, t in enumerate(tasks)} for s in (0, 1)},
    }
    timed = {} if wall_s is None else {"wall_s": wall_s}
    return {
        arm: {
            s: {"tries": 4, "before": {"per_task": before, **timed}, "after": {"per_task": a, **timed}}
            for s, a in per_seed.items()
        }
        for arm, per_seed in after.items()
    }


def test_the_report_says_how_precisely_the_held_out_change_was_measured(tmp_path):
    from selective_rollout.analysis.power import change_precision

    exp = ExperimentConfig(base="cpu_default.yaml", arms={"off": [], "on": []}, seeds=[0, 1])
    rows = [r for r in _rows() if r["seed"] < 2]  # training 110 s (off), 97.5 s (on) per seed
    evals = _evals(wall_s=30.0)
    write_outputs(tmp_path, exp, rows, evals)
    md = (tmp_path / "experiment.md").read_text()
    section = md.split("## How precisely the held-out change is measured")[1].splitlines()
    off = next(ln for ln in section if ln.startswith("| off | +0.0% |"))
    assert off.count("none / none") == 3  # no change: no number of seeds shows one
    on = next(ln for ln in section if ln.startswith("| on | +12.5% |")).split(" | ")
    assert on[3:5] == ["4 x 16", f"{change_precision(_per_seed(evals['on']), 4).between_tasks:.4f}"]
    # the same change on both seeds: no seed-to-seed spread, and no covariance
    assert on[6:8] == ["0.0000", "+0.0000"]
    fit = change_precision(_per_seed(evals["on"]), 4)
    even, likely = fit.seeds_needed(), fit.seeds_needed(odds=0.8)
    # per seed: both arms' training (207.5 s) + 2 after and 1 shared before evaluation (90 s), the
    # evaluations twice as long at twice the tries
    assert on[8] == f"{even} ({even * 297.5 / 3600:.1f} h) / {likely} ({likely * 297.5 / 3600:.1f} h)"
    even8 = fit.seeds_needed(tries=8)
    assert on[9].startswith(f"{even8} ({even8 * 387.5 / 3600:.1f} h) / ")
    # arms that played their own 'before' pay for it twice
    for arm, per_seed in evals.items():
        for e in per_seed.values():
            e["before"] = {**e["before"], "wall_s": 30.0 + (arm == "on")}
    write_outputs(tmp_path, exp, rows, evals)
    md = (tmp_path / "experiment.md").read_text()
    on = next(ln for ln in md.split("## How precisely")[1].splitlines() if ln.startswith("| on |"))
    assert f"{even} ({even * 328.5 / 3600:.1f} h) / " in on
    write_outputs(tmp_path, exp, rows, _evals(wall_s=None))
    md = (tmp_path / "experiment.md").read_text()
    assert "did not record their evaluation times" in md and " h) / " not in md
    write_outputs(tmp_path, exp, rows)
    assert "How precisely" not in (tmp_path / "experiment.md").read_text()


def _per_seed(runs: dict[int, dict]) -> dict[int, tuple[dict, dict]]:
    return {s: (e["before"]["per_task"], e["after"]["per_task"]) for s, e in runs.items()}


def _logged(run: Path, groups: list[tuple[int, str, list[float | None], Outcome]]) -> Path:
    run.mkdir()
    with GroupWriter(run / "rollouts.jsonl") as w:
        for n, (iteration, task, rewards, outcome) in enumerate(groups):
            trajs = [Trajectory(index=i, steps=[Step(action="go")], reward=r) for i, r in enumerate(rewards)]
            w.write(GroupRecord(f"g{n}", task, "pick", trajs, outcome=outcome, iteration=iteration))
    return run


def test_cuts_are_checked_against_the_reference_run_of_the_same_task_and_iteration(tmp_path):
    done, cut = Outcome.COMPLETED, Outcome.CUT
    reference = _logged(
        tmp_path / "off",
        [(0, "a", [1.0, 1.0], done), (0, "b", [0.0, 1.0], done), (1, "a", [0.0, 0.0], done)],
    )
    gated = _logged(
        tmp_path / "on",
        [
            (0, "a", [None, None], cut),  # zero-variance in the reference: a true cut
            (0, "b", [None, None], cut),  # mixed in the reference: a false cut
            (1, "a", [None, None], cut),  # zero-variance there again
            (1, "z", [None, None], cut),  # the reference never ran z in iteration 1: not compared
            (0, "c", [1.0, 1.0], done),  # not a cut
        ],
    )
    assert paired_cut_precision(reference, gated) == {
        "cuts_matched": 3,
        "paired_cut_precision": 2 / 3,
        "false_cuts": 1,  # b was informative in the reference: one informative group lost
        "cuts_all_fail": 1,  # a in iteration 1 (every reward 0)
        "cuts_all_succeed": 1,  # a in iteration 0 (every reward 1)
    }
    assert paired_cut_precision(reference, reference) == {
        "cuts_matched": 0,
        "paired_cut_precision": None,
        "false_cuts": 0,
        "cuts_all_fail": 0,
        "cuts_all_succeed": 0,
    }


def test_bad_experiment_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "none.yaml")
    bad = tmp_path / "x.yaml"
    bad.write_text("base: cpu_default.yaml\narms: {only: []}\n")
    with pytest.raises(ConfigError, match="arms"):
        load_experiment(bad)
    bad.write_text("base: cpu_default.yaml\narms: {on: [], off: []}\n")
    with pytest.raises(ConfigError, match="quote such arm names"):
        load_experiment(bad)
    bad.write_text("base: nowhere.yaml\narms: {a: [], b: []}\n")
    with pytest.raises(ConfigError, match="base config"):
        load_experiment(bad)


def test_gate_memory_names_earlier_arms_on_other_seeds(tmp_path):
    from selective_rollout.analysis.experiment import run_overrides

    good = tmp_path / "x.yaml"
    good.write_text(
        "base: cpu_default.yaml\narms: {ref: [], dapo: [], hist: [gate.name=history]}\n"
        "seeds: [0, 1, 2]\ngate_memory: {hist: [ref, dapo]}\n"
    )
    (tmp_path / "cpu_default.yaml").write_text("name: x\n")
    exp, _ = load_experiment(good)
    got = [o for layer in run_overrides(exp, Path("out"), "hist", 1) for o in layer]
    memory = [o for o in got if o.startswith("gate.observe_logs=")]
    # seed 1 learns from seeds 0 and 2 of both arms, never from its own (paired) seed
    assert memory == [
        "gate.observe_logs=[out/ref-s0/rollouts.jsonl,out/ref-s2/rollouts.jsonl,"
        "out/dapo-s0/rollouts.jsonl,out/dapo-s2/rollouts.jsonl]"
    ]
    assert got[-4:] == ["seed=1", "driver.task_shuffle_seed=1", "name=hist-s1", "driver.run_dir=out/hist-s1"]
    ref = run_overrides(exp, Path("out"), "ref", 1)
    assert not any(o.startswith("gate.observe_logs") for layer in ref for o in layer)
    for text, match in [
        ("arms: {ref: [], hist: []}\nseeds: [0, 1]\ngate_memory: {hist: [nope]}", "not in arms"),
        ("arms: {hist: [], ref: []}\nseeds: [0, 1]\ngate_memory: {hist: [ref]}", "must come before"),
        ("arms: {ref: [], hist: []}\nseeds: [0]\ngate_memory: {hist: [ref]}", "at least 2 seeds"),
    ]:
        good.write_text("base: cpu_default.yaml\n" + text + "\n")
        with pytest.raises(ConfigError, match=match):
            load_experiment(good)


def test_before_eval_key_ignores_what_acts_only_in_training():
    from selective_rollout.analysis.experiment import before_eval_key
    from selective_rollout.config import load_config

    def key(*overrides: str) -> str:
        return before_eval_key(load_config("configs/cpu_default.yaml", list(overrides)))

    base = key("rollout.strategy=none")
    # the A/B arms differ only in what the evaluation does not use: one 'before' serves them all
    assert base == key("rollout.strategy=selective+dapo", "gate.name=history", "name=other")
    assert base == key("rollout.refill=false", "rollout.audit_budget=0", "trainer.lr=1e-6")
    # another seed, other held-out tasks or other weights are another evaluation
    assert base != key("seed=1") and base != key("eval.num_tasks=4") and base != key("warm_start.epochs=3")


def test_shipped_ab_config_loads():
    exp, base = load_experiment("configs/experiments/ab_cpu.yaml")
    assert list(exp.arms) == ["gate_off", "dapo", "gate_on", "selective_dapo", "paper_protocol"]
    assert base.name == "cpu_default.yaml"


SHIPPED_EXPERIMENTS = sorted(str(p) for p in Path("configs/experiments").glob("*.yaml"))
assert SHIPPED_EXPERIMENTS, "configs/experiments/ holds no experiment file"


@pytest.mark.parametrize("path", SHIPPED_EXPERIMENTS)
def test_every_arm_of_a_shipped_experiment_is_a_valid_run(path, tmp_path):
    """An arm whose overrides do not validate would fail an hour into `make experiment-*`."""
    from selective_rollout.analysis.experiment import run_overrides
    from selective_rollout.config import load_config

    exp, base = load_experiment(path)
    for arm in exp.arms:  # a gate memory's logs must exist to validate: stand-ins
        for src in exp.gate_memory.get(arm, []):
            for seed in exp.seeds:
                (tmp_path / f"{src}-s{seed}").mkdir(exist_ok=True)
                (tmp_path / f"{src}-s{seed}" / "rollouts.jsonl").touch()
    for arm in exp.arms:
        cfg = load_config(base, layers=run_overrides(exp, tmp_path, arm, exp.seeds[0]))
        assert cfg.name == f"{arm}-s{exp.seeds[0]}"
        if exp.gate_memory.get(arm):
            memory_runs = {Path(p).parent.name for p in cfg.gate.observe_logs}  # never its own seed's
            assert memory_runs and not any(run.endswith(f"-s{exp.seeds[0]}") for run in memory_runs)


def test_a_finished_run_is_reused_only_for_the_same_config(tmp_path):
    from selective_rollout.analysis.experiment import finished_run
    from selective_rollout.config import dump_config, load_config

    cfg = load_config("configs/cpu_default.yaml", ["driver.iterations=2"])
    run = tmp_path / "arm-s0"
    assert not finished_run(run, cfg)  # nothing there yet
    run.mkdir()
    dump_config(cfg, run / "config.yaml")
    assert not finished_run(run, cfg)  # started, no report: the trainer resumes it
    (run / "report.json").write_text('{"iterations": 1, "eval": {"before": {}}}')
    assert not finished_run(run, cfg)  # stopped after iteration 1
    (run / "report.json").write_text('{"iterations": 2, "eval": {"before": {}, "after": {}}}')
    assert finished_run(run, cfg)
    with pytest.raises(ConfigError, match="different config"):
        finished_run(run, load_config("configs/cpu_default.yaml", ["driver.iterations=2", "gate.k=10"]))
    # where and on which allocator the actors ran is not part of what the run computed
    moved = ["driver.iterations=2", "placement.engine_allocator=jemalloc", "placement.env_worker_spread=true"]
    assert finished_run(run, load_config("configs/cpu_default.yaml", moved))
    # nor the folder it wrote into: an arm of the same config copied from another experiment's folder
    copied = ["driver.iterations=2", f"driver.run_dir={tmp_path / 'elsewhere' / 'arm-s0'}"]
    assert finished_run(run, load_config("configs/cpu_default.yaml", copied))


@pytest.mark.slow
@pytest.mark.ray
def test_tiny_real_experiment(ray_cluster, tiny_games, tmp_path, caplog):
    """Two arms, one seed, one iteration each, over the real stack: CSV, MD with CIs, PNG, sweep."""
    from selective_rollout.analysis.experiment import run_experiment

    exp = tmp_path / "ab.yaml"
    overrides = [
        f"env.games_dir={tiny_games}",
        "env.preset=tiny",  # the tiny_games fixture (the profile plays medium games)
        "env.n_train=6",  # the tiny_games fixture's set
        "env.n_valid=2",
        "env.num_workers=1",
        "rollout.group_size=2",
        "rollout.groups_per_iteration=1",
        "rollout.max_steps=4",
        "gate.name=prefix_edit",  # the paper's gate (the profile's stalled one decides at step 11)
        "gate.k=2",
        "gate.tau=0.5",
        "warm_start.enabled=false",
        "eval.num_tasks=1",
        "driver.iterations=1",
        "logging.backends=[jsonl]",
        "logging.progress=false",
    ]
    exp.write_text(
        "name: tiny\nbase: " + str(Path("configs/cpu_default.yaml").resolve()) + "\n"
        "overrides: [" + ", ".join(f'"{o}"' for o in overrides) + "]\n"
        "arms: {ungated: [rollout.strategy=none], gated: [rollout.strategy=selective]}\n"
        "seeds: [0]\nsweep: {k: [2], tau: '0.1,0.5'}\n"
    )
    with caplog.at_level(logging.INFO, logger="selective_rollout"):
        report = run_experiment(exp, tmp_path / "out")
    out = tmp_path / "out"
    # the gated arm starts from the ungated one's weights on its tasks: its 'before' is reused
    played = [r.getMessage() for r in caplog.records if r.getMessage().startswith("held-out (before)")]
    assert len(played) == 2 and "not played again" not in played[0] and "not played again" in played[1]
    reports = [json.loads((out / f"{a}-s0" / "report.json").read_text()) for a in ("ungated", "gated")]
    assert reports[0]["eval"]["before"] == reports[1]["eval"]["before"]
    with (out / "experiment.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["arm"], r["seed"]) for r in rows] == [("ungated", "0"), ("gated", "0")]
    assert all(float(r["wall_s"]) > 0 and float(r["step_tokens"]) > 0 for r in rows)
    text = report.read_text()
    assert "Paired differences vs `ungated`" in text and "| gated | wall-clock (s) |" in text
    assert "## Held-out change pooled over seeds" in text and "| gated | " in text.split("pooled")[-1]
    assert (out / "experiment.png").stat().st_size > 5_000
    assert (out / "sweep" / "gate_eval.csv").is_file()
    for r in rows:
        assert int(r["groups_kept"]) + int(r["groups_cut"]) >= 1 and float(r["rollout_wall_s"]) > 0
    # a finished arm keeps its logs and report, not its checkpoints (keep_checkpoints: false)
    assert (out / "gated-s0" / "rollouts.jsonl").is_file()
    assert not (out / "gated-s0" / "checkpoints").exists()
    # the first cut is of a task the ungated arm also ran; a refilled task may not be
    cut, matched = int(rows[1]["groups_cut"]), int(rows[1]["cuts_matched"])
    assert rows[0]["cuts_matched"] == "" and matched <= cut and (matched >= 1 or cut == 0)

    # run again: both arms are read back from their finished runs, nothing is trained again
    metrics = out / "gated-s0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    run_experiment(exp, out)
    with (out / "experiment.csv").open() as fh:
        assert list(csv.DictReader(fh)) == rows
    assert metrics.stat().st_mtime_ns == before


def test_a_variant_takes_the_base_and_overrides_of_its_origin(tmp_path):
    (tmp_path / "origin.yaml").write_text(
        "base: " + str(Path("configs/cpu_default.yaml").resolve()) + "\n"
        "overrides: [driver.iterations=8, eval.tries=4]\narms: {a: [], b: []}\n"
    )
    (tmp_path / "variant.yaml").write_text(
        "overrides_of: origin.yaml\noverrides: [eval.tries=2]\narms: {a: [], c: [trainer.lr=1e-5]}\n"
    )
    exp, base = load_experiment(tmp_path / "variant.yaml")
    assert base == Path("configs/cpu_default.yaml").resolve()
    assert exp.overrides == ["driver.iterations=8", "eval.tries=4", "eval.tries=2"]  # its own last
    (tmp_path / "both.yaml").write_text("base: x.yaml\noverrides_of: origin.yaml\narms: {a: [], b: []}\n")
    with pytest.raises(ConfigError, match="both name a base run config"):
        load_experiment(tmp_path / "both.yaml")
    (tmp_path / "bare.yaml").write_text("arms: {a: [], b: []}\n")
    with pytest.raises(ConfigError, match="names no base run config"):
        load_experiment(tmp_path / "bare.yaml")


def test_pipeline_arms_are_compared_per_iteration_and_by_delivery(tmp_path):
    """The figures an async-vs-sync experiment pairs: seconds per iteration, informative groups per
    hour and who waited, read from the report (absent from a report written before them)."""
    run = _report(tmp_path)
    report = json.loads((run / "report.json").read_text())
    throughput = {"engine_wait_frac": 0.25, "learner_wait_frac": 0.5, "informative_groups_per_hour": 90.0}
    (run / "report.json").write_text(json.dumps({**report, "throughput": throughput}))
    metrics = arm_metrics(run)
    assert metrics["s_per_iteration"] == 5.0 and metrics["informative_per_hour"] == 90.0
    assert (metrics["engine_wait_frac"], metrics["learner_wait_frac"]) == (0.25, 0.5)
    assert arm_metrics(_report(tmp_path / "old"))["informative_per_hour"] is None


def test_seeds_runs_a_subset_of_the_files_seeds_and_refuses_others(capsys):
    from selective_rollout.analysis.experiment import main

    assert main(["--config", "configs/experiments/async_cpu.yaml", "--dry-run", "--seeds", "1,0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 * 2  # three arms, two seeds, in the file's order
    assert lines[0].startswith("sync_split-s0:") and lines[1].startswith("sync_split-s1:")
    assert main(["--config", "configs/experiments/async_cpu.yaml", "--dry-run", "--seeds", "7"]) == 2
    assert "--seeds [7]: the experiment's seeds are [0, 1, 2, 3, 4, 5]" in capsys.readouterr().err
    # an arm whose gate remembers the other seeds' runs would be another run on fewer seeds
    assert main(["--config", "configs/experiments/ab_gates_cpu.yaml", "--dry-run", "--seeds", "0"]) == 2
    assert "gate_memory" in capsys.readouterr().err


def test_arms_runs_a_subset_of_the_files_arms_and_refuses_what_they_need(capsys):
    from selective_rollout.analysis.experiment import main

    config = "configs/experiments/async_cpu.yaml"
    assert main(["--config", config, "--dry-run", "--arms", "async_split,sync_split", "--seeds", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # the file's order kept: sync_split stays the reference the others pair with
    assert [line.split(":")[0] for line in lines] == ["sync_split-s0", "async_split-s0"]
    assert main(["--config", config, "--dry-run", "--arms", "sync_split,nope"]) == 2
    assert "--arms ['sync_split', 'nope']: name at least two" in capsys.readouterr().err
    assert main(["--config", config, "--dry-run", "--arms", "sync_split"]) == 2
    capsys.readouterr()
    # an arm whose gate remembers another arm's runs needs that arm
    gates = "configs/experiments/ab_gates_cpu.yaml"
    assert main(["--config", gates, "--dry-run", "--arms", "gate_off,history"]) == 2
    assert "keep them too" in capsys.readouterr().err
