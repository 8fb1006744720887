"""A/B experiments: arms x seeds on identical task streams, with paired bootstrap CIs (the top layer).

    python -m selective_rollout.experiment --config configs/experiments/ab_cpu.yaml [--out DIR]
        [--tiny] [--dry-run] [--seeds 0,1]

Every arm is a full training run (the driver, in this process, over one Ray cluster) from the
same base config plus the arm's overrides. For a given seed every arm sees the same task
stream (``driver.task_shuffle_seed`` = seed), the same warm start and the same held-out tasks,
so per-seed differences between arms are paired. Writes ``experiment.csv`` (one row per arm and
seed), ``experiment.md`` (per-arm means; per pair the mean difference with a 95% bootstrap CI over
seeds, the paper's protocol; the held-out change pooled over seeds, its CI over tasks) and
``experiment.png``; then pools every arm's rollouts for the offline K x tau gate sweep
(``sweep/gate_eval.csv`` and ``sweep/gate_pareto.png``).

``--tiny`` trains every arm on the first seed at the smallest size (``TINY_RUN``) and writes the
same outputs in minutes; ``--dry-run`` builds and validates every run's config and trains nothing.
CI runs both (tests/bench), so that an experiment's command cannot silently stop working.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from selective_rollout.config import ConfigError, RunConfig, load_config
from selective_rollout.policy_eval import per_task_changes, per_try_changes
from selective_rollout.reporting.power import MAX_SEEDS, change_precision, paired_seeds_needed
from selective_rollout.stats import bootstrap_ci, cluster_bootstrap_ci

log = logging.getLogger("selective_rollout.experiment")

METRICS = {
    "wall_s": "wall-clock (s)",
    "s_per_iteration": "wall-clock per iteration (s)",
    "informative_per_hour": "informative groups trained per hour",
    "engine_wait_frac": "engines' share of time waiting",
    "learner_wait_frac": "learners' share of time waiting",
    "rollout_wall_s": "rollout wall-clock (s)",
    "step_tokens": "rollout step-tokens",
    "groups_cut": "groups cut",
    "groups_kept": "groups trained on",
    "informative_kept": "informative groups trained on",
    "rollout_s_per_informative": "rollout s per informative group",
    "step_tokens_per_informative": "step-tokens per informative group",
    "audit_precision": "audited gate precision",
    "cuts_matched": "cuts matched in the reference run",
    "paired_cut_precision": "cuts zero-variance in the reference run",
    "false_cuts": "informative groups lost to false cuts (by the reference run)",
    "cuts_all_fail": "cuts of groups all-fail in the reference run",
    "cuts_all_succeed": "cuts of groups all-succeed in the reference run",
    "audited_all_fail": "audited stops that were all-fail",
    "audited_all_succeed": "audited stops that were all-succeed",
    "trajectories_stopped": "trajectories ended early by the trajectory stop rule",
    "trajectory_label_precision": "audited label precision of trajectory stops",
    "zero_var_frac": "zero-variance share",
    "success_before": "held-out success before",
    "success_after": "held-out success after",
    "success_gain": "held-out change (after - before, paired per task)",
    "success_gain_ci_low": "held-out change: 95% CI low (over tasks)",
}
# Metrics that are themselves signed changes: a difference of them relative to the reference's
# value divides by a change that may be near zero or negative (+0.125 over -0.083 read "-150%").
NO_RELATIVE = {"success_gain", "success_gain_ci_low"}
# Precisions over audits: an arm's figure pools its seeds' audits (right / audited) rather than
# averaging the seeds' ratios, where one seed's single audit would weigh as much as another's ten
POOLED = {
    "audit_precision": ("audits_right", "audits"),
    "trajectory_label_precision": ("trajectory_labels_right", "trajectory_stops_audited"),
}
# What an informative group costs: the gate's saving, measured where it is spent
COST_METRICS = ("step_tokens_per_informative", "rollout_s_per_informative")
# The plot's panels unless an experiment names its own (``plot:``)
PLOT_METRICS = (
    "rollout_s_per_informative",
    "step_tokens_per_informative",
    "informative_kept",
    "groups_cut",
    "zero_var_frac",
    "success_gain",
)
# The smallest run that still plays every part of an iteration (a rollout, a learner step, a
# weight sync, the held-out evaluation before and after): tiny games generated wherever
# env.games_dir points, one group of G = 2, no warm start, one held-out task, one iteration. The
# episodes keep the profile's length: a gate or trajectory stop decides at its own step, which a
# shorter episode would refuse (the gate would never look).
# The runner's --tiny mode and the bench scripts' run it, and CI runs those (tests/bench), so a
# command a record names cannot silently stop working; its figures mean nothing.
TINY_RUN = [
    "env.preset=tiny",
    "env.generate=true",
    "env.n_train=6",
    "env.n_valid=2",
    "env.num_workers=1",
    "rollout.group_size=2",
    "rollout.groups_per_iteration=1",
    "rollout.max_groups_in_flight=1",
    "warm_start.enabled=false",
    "eval.num_tasks=1",
    "eval.tries=1",
    "driver.iterations=1",
    "logging.backends=[jsonl]",
    "logging.progress=false",
]


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: list[int] = Field(default_factory=lambda: [2, 4, 6])
    tau: str = "0.02:0.30:0.04"


class ExperimentConfig(BaseModel):
    """An experiment file: which base run, which arms, which seeds."""

    model_config = ConfigDict(extra="forbid")
    # the shared overrides as layers: an origin's (overrides_of), then this file's own
    _layers: list[list[str]] | None = PrivateAttr(default=None)
    name: str = "experiment"
    base: str | None = Field(
        None, description="base run config (path relative to the experiment file or the CWD)"
    )
    overrides: list[str] = Field(default_factory=list, description="applied to every arm")
    overrides_of: str | None = Field(
        None,
        description="another experiment file (relative to this one) whose base and overrides this "
        "one takes, before its own: variants of one profile share a single list, so their runs "
        "stay identical to the original's and are reused from its folder",
    )
    arms: dict[str, list[str]] = Field(
        min_length=2, description="arm name -> its overrides; first = reference"
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    bootstrap: int = Field(2000, ge=100)
    aimed_change: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="the relative change of the cost per informative group the experiment aims to "
        "detect: the report says how many seeds a CI over seeds excluding 0 would take at it",
    )
    sweep: SweepSpec | None = SweepSpec()
    plot: list[str] = Field(
        default_factory=lambda: list(PLOT_METRICS),
        description="the metrics experiment.png draws, one panel each (the held-out change is always drawn)",
    )
    versus: list[str] = Field(
        default_factory=list,
        description="arms besides the first to compare every other arm's held-out change with (the "
        "gated arms against the arm that only leaves zero-variance groups out of the loss, say)",
    )
    gate_memory: dict[str, list[str]] = Field(
        default_factory=dict,
        description="arm -> arms whose runs on the *other* seeds its gate observes before it starts "
        "(gate.observe_logs): a gate with memory (history) meets tasks it has seen, as in a longer "
        "run, but never the paired run of its own seed; the listed arms must come before it",
    )
    share_before_eval: bool = Field(
        True,
        description="play the held-out 'before' evaluation once per seed: the arms of a seed start "
        "from the same weights on the same tasks, and the greedy evaluation scores the same weights "
        "the same (eval.max_in_flight 1), so later arms reuse the first one's instead of replaying it",
    )
    keep_checkpoints: bool = Field(
        False,
        description="keep each finished arm's checkpoints; a finished arm is read back from its "
        "report.json, so by default its checkpoints (optimizer state included: ~1.6 GB each for the "
        "135M CPU profile) are deleted once the arm is done",
    )

    @field_validator("plot")
    @classmethod
    def _known_metrics(cls, value: list[str]) -> list[str]:
        unknown = [key for key in value if key not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(METRICS)}")
        return value

    def layers(self) -> list[list[str]]:
        """The shared overrides as ``load_config`` layers: an origin's, then this file's."""
        return self._layers if self._layers is not None else [self.overrides]


def load_experiment(path: str | Path) -> tuple[ExperimentConfig, Path]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file not found: {path}")
    try:
        exp = ExperimentConfig.model_validate(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    except ValidationError as exc:
        first = exc.errors()[0]
        hint = (
            " (YAML reads bare on/off/yes/no as booleans: quote such arm names)"
            if "[key]" in first["loc"]
            else ""
        )
        raise ConfigError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}{hint}") from None
    if exp.overrides_of is not None:
        if exp.base is not None:
            raise ConfigError(f"{path}: base: and overrides_of: both name a base run config; keep one")
        origin, origin_base = load_experiment(path.parent / exp.overrides_of)
        own = exp.overrides
        exp = exp.model_copy(update={"base": str(origin_base), "overrides": [*origin.overrides, *own]})
        exp._layers = [*origin.layers(), own]
    if exp.base is None:
        raise ConfigError(f"{path}: base: the experiment names no base run config (base: or overrides_of:)")
    order = list(exp.arms)
    unknown = [arm for arm in exp.versus if arm not in exp.arms]
    if unknown:
        raise ConfigError(f"{path}: versus names arms that are not in arms: {', '.join(unknown)}")
    for arm, sources in exp.gate_memory.items():
        if arm not in exp.arms or any(src not in exp.arms for src in sources):
            raise ConfigError(f"{path}: gate_memory names an arm that is not in arms: {arm}: {sources}")
        if any(order.index(src) >= order.index(arm) for src in sources):
            raise ConfigError(f"{path}: gate_memory: the arms {arm} learns from must come before it in arms")
        if len(exp.seeds) < 2:
            raise ConfigError(f"{path}: gate_memory needs at least 2 seeds (an arm learns from the others)")
    base = Path(exp.base) if Path(exp.base).is_file() else path.parent / exp.base
    if not base.is_file():
        raise ConfigError(f"{path}: base config {exp.base} not found")
    return exp, base


def tiny_experiment(exp: ExperimentConfig, games_dir: Path) -> ExperimentConfig:
    """``--tiny``: ``exp`` at the smallest size that still trains every arm and writes every
    output: its first seed, each arm's overrides followed by ``TINY_RUN`` (an arm's own sizes
    shrink too) with the games generated into ``games_dir``, no gate memory (it needs two seeds:
    a gate with memory starts empty), the fewest bootstrap resamples the schema allows and a
    two-point sweep. What CI runs so that the experiment's command keeps working; the figures
    mean nothing."""
    tiny = [*TINY_RUN, f"env.games_dir={games_dir}"]
    small = exp.model_copy(
        update={
            "seeds": exp.seeds[:1],
            "arms": {arm: [*overrides, *tiny] for arm, overrides in exp.arms.items()},
            "gate_memory": {},
            "bootstrap": 100,
            "sweep": None if exp.sweep is None else SweepSpec(k=[2], tau="0.1,0.3"),
        }
    )
    small._layers = exp._layers
    return small


def run_arm(
    cfg: RunConfig,
    run_dir: Path,
    keep_checkpoints: bool = False,
    before_eval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One training run, or the finished run already in ``run_dir`` when its config is identical
    (an interrupted experiment resumes: finished arms are read back, a partial one resumes from
    its last checkpoint); returns the run's experiment metrics. ``before_eval``: the held-out
    summary of the starting weights when already known (``Driver``). A finished arm's
    checkpoints are deleted unless ``keep_checkpoints``: nothing in the experiment reads them
    again, and ten arms of the CPU profile would otherwise hold ~30 GB."""
    from selective_rollout.driver import Driver

    if finished_run(run_dir, cfg):
        log.info("reusing the finished run in %s (same config)", run_dir)
        return arm_metrics(run_dir)
    driver = Driver(cfg, run_dir, before_eval=before_eval)
    try:
        driver.run()
    finally:
        driver.close()
    metrics = arm_metrics(run_dir)
    if not keep_checkpoints and finished_run(run_dir, cfg):
        shutil.rmtree(driver.ckpt_dir, ignore_errors=True)
    return metrics


def before_eval_key(cfg: RunConfig) -> str:
    """What decides a run's held-out 'before' score: its evaluation config (the arm's rollout
    strategy, refill and audit are already neutralised there) without the sections that act only
    once training starts (gate, trainer, driver, logging) and the run's name. Two runs with one
    key start from the same weights and play the same held-out episodes."""
    from selective_rollout.rollout.coordinator import evaluation_config

    dump = evaluation_config(cfg).model_dump(
        mode="json", exclude={"gate", "trainer", "driver", "logging", "name"}
    )
    return json.dumps(dump, sort_keys=True)


def finished_run(run_dir: Path, cfg: RunConfig) -> bool:
    """True when ``run_dir`` holds a complete run of exactly ``cfg``; a different config is an error.

    The ``placement`` section is left out of the comparison: it says where the actors run and on
    which allocator, not what they compute, so an experiment resumed on another cluster layout (or
    with ``placement.engine_allocator`` changed to get past an out-of-memory kill) is the same experiment."""
    saved, report = run_dir / "config.yaml", run_dir / "report.json"
    if not saved.is_file():
        return False
    ran = RunConfig.model_validate(yaml.safe_load(saved.read_text()))
    if ran.model_dump(exclude={"placement"}) != cfg.model_dump(exclude={"placement"}):
        raise ConfigError(f"{run_dir} holds a run of a different config: pass another --out")
    if not report.is_file():
        return False
    done = json.loads(report.read_text())
    return done.get("iterations") == cfg.driver.iterations and "after" in done.get("eval", {})


def arm_metrics(run_dir: Path) -> dict[str, Any]:
    """The experiment's metrics of one finished run, from its report.json."""
    report = json.loads((run_dir / "report.json").read_text())
    r, ev = report["rollout"], report["eval"]
    informative = r["informative_kept"]
    stops = r.get("trajectory_stops", {})  # a report written before trajectory stops has none
    throughput = report.get("throughput") or {}  # a report written before the idle figures has none
    return {
        "wall_s": report["wall_s"],
        "s_per_iteration": report["wall_s"] / report["iterations"] if report["iterations"] else None,
        "informative_per_hour": throughput.get("informative_groups_per_hour"),
        "engine_wait_frac": throughput.get("engine_wait_frac"),
        "learner_wait_frac": throughput.get("learner_wait_frac"),
        "rollout_wall_s": report["rollout_wall_s"],
        "step_tokens": r["step_tokens_spent"],
        "groups_cut": r["outcomes"]["cut"],
        "groups_kept": r["kept"],
        "informative_kept": informative,
        "rollout_s_per_informative": report["rollout_wall_s"] / informative if informative else None,
        "step_tokens_per_informative": r["step_tokens_spent"] / informative if informative else None,
        "audit_precision": r["audit_precision"],
        "audits": r["audited"],
        "audits_right": round(r["audit_precision"] * r["audited"]) if r["audited"] else 0,
        # a report written before audits were counted by class has no such entry
        "audited_all_fail": r.get("audited_by_class", {}).get("all-fail"),
        "audited_all_succeed": r.get("audited_by_class", {}).get("all-succeed"),
        "trajectories_stopped": stops.get("stopped", 0),
        "trajectory_label_precision": stops["label_right"] / stops["audited"]
        if stops.get("audited")
        else None,
        "trajectory_stops_audited": stops.get("audited", 0),
        "trajectory_labels_right": stops.get("label_right", 0),
        "zero_var_frac": r["zero_var_frac"],
        "success_before": ev.get("before", {}).get("success_rate"),
        "success_after": ev.get("after", {}).get("success_rate"),
        "success_gain": (report.get("eval_gain") or {}).get("mean"),
        "success_gain_ci_low": ((report.get("eval_gain") or {}).get("ci95") or [None])[0],
    }


def paired_cut_precision(reference: Path, run: Path) -> dict[str, Any]:
    """The gate's precision without an audit: of ``run``'s cut groups, the share whose task ended
    with one reward for all in the same iteration of the ``reference`` run (the ungated arm on
    the same task stream). Cuts of tasks the reference did not run in that iteration (its stream
    diverged, e.g. after a refill) are left out; ``cuts_matched`` says how many were compared."""
    from selective_rollout.records import Outcome, read_groups

    outcome = {
        (g.iteration, g.task_id): g.reward_class
        for g in read_groups(reference / "rollouts.jsonl")
        if g.reward_class is not None
    }
    matched = [
        outcome[(g.iteration, g.task_id)]
        for g in read_groups(run / "rollouts.jsonl")
        if g.outcome is Outcome.CUT and (g.iteration, g.task_id) in outcome
    ]
    right = sum(kind != "mixed" for kind in matched)
    return {
        "cuts_matched": len(matched),
        "paired_cut_precision": right / len(matched) if matched else None,
        "false_cuts": len(matched) - right,
        "cuts_all_fail": matched.count("all-fail"),
        "cuts_all_succeed": matched.count("all-succeed"),
    }


def held_out_changes(evals: dict[str, Any]) -> dict[str, float]:
    """Per held-out task, success after minus before in one run's report ``eval`` section ({}
    without both evaluations)."""
    return per_task_changes(evals.get("before", {}), evals.get("after", {}))


def _mean_over_tasks(per_seed: list[dict[str, float]], resamples: int) -> dict[str, Any]:
    """Mean over every (seed, task) value with a 95% CI resampling tasks: a task's values on
    different seeds share its difficulty, so they are drawn together, not as independent pairs."""
    by_task: dict[str, list[float]] = {}
    for values in per_seed:
        for task, value in values.items():
            by_task.setdefault(task, []).append(value)
    clusters = [np.asarray(v, dtype=float)[:, None] for v in by_task.values()]
    lo, hi = cluster_bootstrap_ci(clusters, lambda rows: float(rows.mean()), resamples)
    pooled = np.concatenate(clusters) if clusters else np.zeros(0)
    return {
        "mean": float(pooled.mean()) if pooled.size else None,
        "ci95": [lo, hi],
        "tasks": len(clusters),
        "pairs": int(pooled.size),
    }


def pooled_held_out(
    changes: dict[str, dict[int, dict[str, float]]], reference: str, resamples: int
) -> list[dict[str, Any]]:
    """Per arm, the held-out change (after - before per seed and task) pooled over the seeds, with
    its CI over tasks: one seed's 24 tasks leave a CI about as wide as the change itself, and the
    seeds' runs are independent draws of the same training. Beside it, vs ``reference``: the
    difference of the two arms' changes on the same seed and task (a paired before cancels)."""
    out = []
    for arm, per_seed in changes.items():
        row: dict[str, Any] = {"arm": arm, **_mean_over_tasks(list(per_seed.values()), resamples)}
        if arm != reference:
            row["vs_reference"] = _held_out_difference(changes, arm, reference, resamples)
        out.append(row)
    return [r for r in out if r["pairs"]]


def _held_out_difference(
    changes: dict[str, dict[int, dict[str, float]]], arm: str, other: str, resamples: int
) -> dict[str, Any]:
    """``arm``'s held-out change minus ``other``'s on the same seeds and tasks, pooled with its CI
    over tasks (``_mean_over_tasks``): the shared 'before' of a seed cancels."""
    ref = changes[other]
    differences = [
        {t: c[t] - ref[seed][t] for t in sorted(c.keys() & ref[seed].keys())}
        for seed, c in changes[arm].items()
        if seed in ref
    ]
    return _mean_over_tasks(differences, resamples)


def versus_section(
    changes: dict[str, dict[int, dict[str, float]]], versus: list[str], resamples: int
) -> list[str]:
    """The held-out change of every other arm minus that of each arm in ``versus`` (the experiment's
    comparisons beside the reference's: the gate against the denominator-only arm, say)."""
    rows = []
    for other in versus:
        for arm in changes:
            if arm == other or other not in changes:
                continue
            d = _held_out_difference(changes, arm, other, resamples)
            if d["pairs"]:
                lo, hi = d["ci95"]
                rows.append(f"| {arm} | {other} | {d['mean']:+.1%} | [{lo:+.1%}, {hi:+.1%}] | {d['pairs']} |")
    if not rows:
        return []
    return [
        "",
        "## Held-out change of each arm minus another's (same seeds and tasks; 95% CI resampling tasks)",
        "",
        "| arm | minus | difference | 95% CI | seed x task pairs |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _paired(rows: list[dict[str, Any]], arm: str, ref: str, key: str) -> tuple[list[float], list[float]]:
    """``arm``'s ``key`` minus ``ref``'s on each seed where both have it, and ``ref``'s values on
    those same seeds: the base a relative difference divides by, so both describe one set of runs."""
    by = {(r["arm"], r["seed"]): r for r in rows}
    seeds = [
        s
        for s in sorted({r["seed"] for r in rows})
        if by.get((arm, s), {}).get(key) is not None and by.get((ref, s), {}).get(key) is not None
    ]
    return [by[(arm, s)][key] - by[(ref, s)][key] for s in seeds], [by[(ref, s)][key] for s in seeds]


def paired_differences(rows: list[dict[str, Any]], arms: list[str], resamples: int) -> list[dict[str, Any]]:
    """Per metric and per arm vs the reference arm: mean paired difference and its bootstrap CI."""
    ref = arms[0]
    out = []
    for arm in arms[1:]:
        for key in METRICS:
            diffs, base = _paired(rows, arm, ref, key)
            if not diffs:
                continue
            lo, hi = bootstrap_ci(diffs, resamples)
            relative = np.mean(base) and key not in NO_RELATIVE
            rel = float(np.mean(diffs) / np.mean(base)) if relative else None
            out.append(
                {
                    "arm": arm,
                    "vs": ref,
                    "metric": key,
                    "mean_diff": float(np.round(np.mean(diffs), 12)),  # no "+2.8e-17" for equal arms
                    "ci_low": lo,
                    "ci_high": hi,
                    "rel": rel,
                    "n": len(diffs),
                }
            )
    return out


def write_outputs(
    out: Path,
    exp: ExperimentConfig,
    rows: list[dict[str, Any]],
    evals: dict[str, dict[int, dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """``experiment.csv``, ``experiment.md`` and ``experiment.png`` from the per-arm-and-seed rows;
    ``evals`` (arm -> seed -> the run's report ``eval`` section, with its config's ``tries``),
    when given, adds the held-out change pooled over seeds and how precisely it was measured."""
    arms = list(exp.arms)
    with (out / "experiment.csv").open("w", newline="") as fh:
        counts = [c for pair in POOLED.values() for c in pair]
        writer = csv.DictWriter(fh, fieldnames=["arm", "seed", *METRICS, *counts], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    diffs = paired_differences(rows, arms, exp.bootstrap)

    def mean(arm: str, key: str) -> str:
        runs = [r for r in rows if r["arm"] == arm]
        if key in POOLED and all(c in r for r in runs for c in POOLED[key]):
            right, audited = (sum(r[c] for r in runs) for c in POOLED[key])
            return f"{right / audited:.3g} ({right} of {audited})" if audited else "n/a"
        vals = [r[key] for r in runs if r.get(key) is not None]
        return f"{np.mean(vals):.3g}" if vals else "n/a"

    lines = [
        f"# Experiment: {exp.name}",
        "",
        f"Seeds: {exp.seeds}; base config `{exp.base}`.",
        "",
        "| arm | " + " | ".join(METRICS.values()) + " |",
        "|---" * (len(METRICS) + 1) + "|",
    ]
    lines += [f"| {a} | " + " | ".join(mean(a, k) for k in METRICS) + " |" for a in arms]
    lines += ["", "Means over seeds; the audited precisions pool the seeds' audits (right of audited)."]
    lines += [
        "",
        f"## Paired differences vs `{arms[0]}` (mean over seeds, 95% bootstrap CI over seeds)",
        "",
        "| arm | metric | difference | 95% CI | relative | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for d in diffs:
        rel = f"{d['rel']:+.1%}" if d["rel"] is not None else "n/a"
        # one paired seed has no spread to resample: a CI there would look falsely exact
        ci = f"[{d['ci_low']:+.4g}, {d['ci_high']:+.4g}]" if d["n"] > 1 else "n/a (1 seed)"
        lines.append(
            f"| {d['arm']} | {METRICS[d['metric']]} | {d['mean_diff']:+.4g} | {ci} | {rel} | {d['n']} |"
        )
    if len(exp.seeds) < 3:
        lines += ["", f"With {len(exp.seeds)} seed(s) the bootstrap CI is only indicative."]
    evals = evals or {}
    changes = {arm: {s: held_out_changes(e) for s, e in runs.items()} for arm, runs in evals.items()}
    pooled = pooled_held_out(changes, arms[0], exp.bootstrap)
    lines += cost_power_section(rows, arms, exp.aimed_change)
    lines += held_out_section(pooled, arms[0])
    lines += versus_section(changes, exp.versus, exp.bootstrap)
    lines += precision_section(pooled, evals, rows)
    lines += ["", "![experiment](experiment.png)"]
    (out / "experiment.md").write_text("\n".join(lines) + "\n")
    plot(out / "experiment.png", rows, arms, pooled, exp.plot)
    return diffs


def cost_power_section(rows: list[dict[str, Any]], arms: list[str], aimed: float) -> list[str]:
    """How many seeds the paired cost per informative group (step-tokens, rollout seconds) of each
    arm against the reference would take for its 95% CI over seeds to exclude 0: at the change
    measured and at the ``aimed`` relative change, from the seed-to-seed spread of the paired
    differences measured here (``reporting.power.paired_seeds_needed``). No lines with fewer than
    2 seeds."""
    ref, out = arms[0], []
    for arm in arms[1:]:
        for key in COST_METRICS:
            diffs, base = _paired(rows, arm, ref, key)
            scale = float(np.mean(base)) if base else 0.0
            if len(diffs) < 2 or not scale:
                continue

            def needed(effect: float, diffs: list[float] = diffs) -> str:
                counts = [paired_seeds_needed(diffs, effect, odds) for odds in (0.5, 0.8)]
                return " / ".join("none" if n is None else str(n) for n in counts)

            spread = float(np.std(diffs, ddof=1)) / scale
            measured = float(np.mean(diffs))
            out.append(
                f"| {arm} | {METRICS[key]} | {measured / scale:+.1%} | {spread:.1%} | {len(diffs)} "
                f"| {needed(measured)} | {needed(aimed * scale)} |"
            )
    if not out:
        return []
    return [
        "",
        f"## Seeds the cost per informative group would take (vs `{ref}`)",
        "",
        "Seeds for the 95% CI over seeds of the paired difference to exclude 0 with even / 80% odds, "
        "if the true change were the one measured or the one aimed at, at the seed-to-seed spread "
        "of the paired differences measured here (`selective_rollout/reporting/power.py`; an order "
        'of magnitude: with few seeds the spread is itself uncertain; "none": more than '
        f"{MAX_SEEDS} or no change).",
        "",
        "| arm | metric | change | SD of the paired difference over seeds (share of the reference's) "
        f"| seeds run | seeds at the measured change | seeds at a {aimed * 100:g}% change |",
        "|---|---|---|---|---|---|---|",
        *out,
    ]


def held_out_section(pooled: list[dict[str, Any]], reference: str) -> list[str]:
    """The markdown lines of the pooled held-out change, none when no arm was evaluated."""
    if not pooled:
        return []

    def cell(p: dict[str, Any]) -> str:
        return f"{p['mean']:+.1%} | [{p['ci95'][0]:+.1%}, {p['ci95'][1]:+.1%}]"

    lines = [
        "",
        "## Held-out change pooled over seeds (after - before per seed and task; 95% CI resampling tasks)",
        "",
        f"| arm | change | 95% CI | change - `{reference}`'s | 95% CI | tasks | seed x task pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pooled:
        versus = cell(p["vs_reference"]) if p.get("vs_reference", {}).get("pairs") else "n/a | n/a"
        lines.append(f"| {p['arm']} | {cell(p)} | {versus} | {p['tasks']} | {p['pairs']} |")
    return lines


def _seed_seconds(
    fits: dict[str, Any], evals: dict[str, dict[int, dict[str, Any]]], rows: list[dict[str, Any]]
) -> tuple[float, float] | None:
    """Per seed, the measured seconds of the fitted arms' training (``wall_s``: iterations only)
    and of their evaluations (mean over seeds): None when a run did not record its evaluation
    times (runs before 2026-12-05)."""
    train = sum(float(np.mean([r["wall_s"] for r in rows if r["arm"] == a])) for a in fits)
    evals_s = []
    for seed in next(iter(evals[a] for a in fits)):
        runs = [evals[a].get(seed, {}) for a in fits]
        # arms that share a seed's 'before' (share_before_eval) played it once: count it once
        befores = [r.get("before", {}) for r in runs]
        played = [b for i, b in enumerate(befores) if b not in befores[:i]]
        walls = [b.get("wall_s") for b in played] + [r.get("after", {}).get("wall_s") for r in runs]
        if any(w is None for w in walls):
            return None
        evals_s.append(sum(walls))
    return train, float(np.mean(evals_s))


def precision_section(
    pooled: list[dict[str, Any]],
    evals: dict[str, dict[int, dict[str, Any]]],
    rows: list[dict[str, Any]],
) -> list[str]:
    """How precisely each arm's pooled held-out change was measured, split into the tasks', the
    sampling's and the seeds' variance (``reporting.power``), and the seeds a CI excluding 0
    would take at this design, at twice the tries and at twice the tasks, at even and at 80%
    odds, with what that costs at this experiment's measured times. No lines with fewer than 2
    seeds evaluated."""
    fits = {}
    for p in pooled:
        runs = evals.get(p["arm"], {})
        done = {s: e for s, e in runs.items() if "before" in e and "after" in e}
        per_seed = {s: (e["before"]["per_task"], e["after"]["per_task"]) for s, e in done.items()}
        try_changes = {s: per_try_changes(e["before"], e["after"]) for s, e in done.items()}
        tries = {e["tries"] for e in runs.values()}
        fit = change_precision(per_seed, tries.pop(), try_changes) if len(tries) == 1 else None
        if fit is not None:
            fits[p["arm"]] = (p, fit)
    if not fits:
        return []
    designs = {(fit.tries, fit.tasks) for _, fit in fits.values()}
    timing = _seed_seconds(fits, evals, rows) if len(designs) == 1 else None

    def needed(fit: Any, tries: int, tasks: int) -> str:
        cells = []
        for odds in (0.5, 0.8):
            seeds = fit.seeds_needed(tries, tasks, odds)
            if seeds is None:
                cells.append("none")
                continue
            if timing is None:
                cells.append(str(seeds))
                continue
            train, evaluation = timing  # evaluation time grows with the episodes it plays
            per_seed = train + evaluation * tries * tasks / (fit.tries * fit.tasks)
            cells.append(f"{seeds} ({seeds * per_seed / 3600:.1f} h)")
        return " / ".join(cells)

    if timing is not None:
        cost = (
            f"; hours for all {len(fits)} arms at this experiment's measured training iterations "
            "and evaluations (startup and checkpoint saves not counted)."
        )
    elif len(designs) > 1:
        cost = "; the arms evaluate different designs, so no hours."
    else:
        cost = "; the runs did not record their evaluation times, so no hours."
    lines = [
        "",
        "## How precisely the held-out change is measured, and what would measure it",
        "",
        "A task's change varies with the task (its true change), the sampling (tries are binomial "
        "draws, before and after: measured from the tries' paired outcomes where the runs recorded "
        "them) and the seed (runs train to different weights), fitted by moments "
        "from these runs (`selective_rollout/reporting/power.py`); at this design the model's "
        "half-width is the bootstrap's standard error, so their agreement checks nothing. Covariance: "
        "of a task's before and after across seeds (they share sampling seeds; without per-try "
        "outcomes the split assumes 0). "
        "Seeds for the 95% CI to exclude 0 with even / 80% odds if the measured change were the "
        "true one, an order of magnitude (the fit itself is uncertain)" + cost,
        "",
        "| arm | change | 95% half-width: model (bootstrap) | tries x tasks | variance: tasks "
        "| sampling, per episode | seed | covariance | seeds at this design | at 2x tries | at 2x tasks |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, (p, fit) in fits.items():
        boot = (p["ci95"][1] - p["ci95"][0]) / 2
        model = fit.half_width(fit.seeds, fit.tries, fit.tasks)
        lines.append(
            f"| {arm} | {fit.mean:+.1%} | {model:.1%} ({boot:.1%}) | {fit.tries} x {fit.tasks} "
            f"| {fit.between_tasks:.4f} | {fit.sampling:.3f} | {fit.training:.4f} | {fit.covariance:+.4f} "
            f"| {needed(fit, fit.tries, fit.tasks)} | {needed(fit, 2 * fit.tries, fit.tasks)} "
            f"| {needed(fit, fit.tries, 2 * fit.tasks)} |"
        )
    return lines


def plot(
    path: Path,
    rows: list[dict[str, Any]],
    arms: list[str],
    pooled: list[dict[str, Any]] | None = None,
    panels: Sequence[str] = PLOT_METRICS,
) -> None:
    """Bars (means) and dots (seeds) of ``panels`` (the held-out change's always among them); its panel also
    draws, per arm, the change pooled over seeds with its CI over tasks (``pooled_held_out``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(panels) if "success_gain" in panels else [*panels, "success_gain"]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.6))
    for ax, key in zip(axes, keys, strict=True):
        for i, arm in enumerate(arms):
            vals = [r[key] for r in rows if r["arm"] == arm and r.get(key) is not None]
            if vals:
                ax.bar(i, np.mean(vals), color=f"C{i}", alpha=0.6)
                ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
        ax.set_title(METRICS[key], fontsize=9)
    change = axes[keys.index("success_gain")]
    title = "held-out change (after - before)"
    change.set_title(title + ("\nred: pooled over seeds, 95% CI" if pooled else ""), fontsize=9)
    change.axhline(0.0, color="0.5", lw=0.8)
    for p in pooled or []:
        i, (lo, hi) = arms.index(p["arm"]), p["ci95"]
        change.errorbar(
            i + 0.25,
            p["mean"],
            yerr=[[p["mean"] - lo], [hi - p["mean"]]],
            fmt="D",
            color="C3",
            ms=4,
            capsize=3,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pooled_sweep(out: Path, sweep: SweepSpec, run_dirs: list[Path]) -> None:
    """The offline K x tau gate sweep over every arm's logged rollouts, pooled."""
    from selective_rollout.gate.offline.evaluate import main as gate_evaluate

    pooled = out / "pooled_rollouts.jsonl"
    with pooled.open("w") as fh:
        for d in run_dirs:
            src = d / "rollouts.jsonl"
            if src.is_file():
                fh.write(src.read_text())
    ks = ",".join(map(str, sweep.k))
    gate_evaluate(["--rollouts", str(pooled), "--out", str(out / "sweep"), "--k", ks, "--tau", sweep.tau])


def run_overrides(
    exp: ExperimentConfig, out: Path, arm: str, seed: int, written_memory_only: bool = False
) -> list[list[str]]:
    """The overrides of ``arm`` on ``seed``, as layers (``load_config``'s): the experiment's, then
    the arm's with its gate memory (the logs of its ``gate_memory`` arms on every other seed), the
    seed and the run folder. An arm that selects another entry (``gate.name=any``) so replaces the
    shared overrides' keys of the one it replaces. ``written_memory_only``: leave out the memory
    logs not written yet (a dry run, before the arms that write them have run)."""
    run_dir = out / f"{arm}-s{seed}"
    memory = [
        str(out / f"{src}-s{other}" / "rollouts.jsonl")
        for src in exp.gate_memory.get(arm, [])
        for other in exp.seeds
        if other != seed
    ]
    if written_memory_only:
        memory = [path for path in memory if Path(path).is_file()]
    return [
        *exp.layers(),
        [
            *exp.arms[arm],
            *([f"gate.observe_logs=[{','.join(memory)}]"] if memory else []),
            f"seed={seed}",
            f"driver.task_shuffle_seed={seed}",
            f"name={arm}-s{seed}",
            f"driver.run_dir={run_dir}",
        ],
    ]


def prepare(
    path: str | Path, out: Path | None, tiny: bool, seeds: Sequence[int] | None = None
) -> tuple[ExperimentConfig, Path, Path]:
    """The experiment file loaded (shrunk by ``tiny_experiment`` with ``tiny``; with ``seeds``, only
    those of its seeds), its base run config and its output folder: ``out``, else
    ``runs/experiment-<name>`` (``-tiny`` appended with ``tiny``, so a tiny run never meets the
    real experiment's runs)."""
    exp, base = load_experiment(path)
    if seeds is not None:
        unknown = sorted(set(seeds) - set(exp.seeds))
        if unknown or not seeds:
            raise ValueError(f"--seeds {list(seeds)}: the experiment's seeds are {exp.seeds}")
        if exp.gate_memory:
            raise ValueError(
                f"--seeds: {path} gives arms a gate memory of the other seeds' runs "
                "(gate_memory), which a subset of seeds would change; run every seed"
            )
        exp = exp.model_copy(update={"seeds": [s for s in exp.seeds if s in set(seeds)]})
    out = out or Path("runs") / f"experiment-{exp.name}{'-tiny' if tiny else ''}"
    return (tiny_experiment(exp, out / "games") if tiny else exp), base, out


def plan_experiment(
    path: str | Path, out: Path | None = None, tiny: bool = False, seeds: Sequence[int] | None = None
) -> list[str]:
    """``--dry-run``: one line per run the experiment would train, each run's config built and
    validated as the run builds it; nothing is trained or written. A gate memory's logs that its
    earlier arms have not written yet are left out of the config checked."""
    exp, base, out = prepare(path, out, tiny, seeds)
    lines = []
    for arm in exp.arms:
        for seed in exp.seeds:
            cfg = load_config(base, layers=run_overrides(exp, out, arm, seed, written_memory_only=True))
            rc = cfg.rollout
            lines.append(
                f"{cfg.name}: {cfg.driver.iterations} iteration(s) of {rc.groups_per_iteration} groups of "
                f"G = {rc.group_size}, {rc.max_steps} steps, {cfg.env.name} {cfg.env.model_extra or {}}, "
                f"strategy {rc.strategy}, gate {cfg.gate.name}, "
                f"{cfg.eval.num_tasks} held-out tasks x {cfg.eval.tries} -> {cfg.driver.run_dir}"
            )
    return lines


def run_experiment(
    path: str | Path, out: Path | None = None, tiny: bool = False, seeds: Sequence[int] | None = None
) -> Path:
    """Every arm on every seed (``seeds``: only those), then the outputs (the module's doc);
    returns experiment.md."""
    exp, base, out = prepare(path, out, tiny, seeds)
    out.mkdir(parents=True, exist_ok=True)
    rows, run_dirs = [], []
    evals_by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    reference = next(iter(exp.arms))
    known_before: dict[str, dict[str, Any]] = {}
    # arm after arm, each over every seed: an arm's reference and gate-memory sources have run
    # on every seed before it starts
    for arm in exp.arms:
        for seed in exp.seeds:
            run_dir = out / f"{arm}-s{seed}"
            cfg = load_config(base, layers=run_overrides(exp, out, arm, seed))
            key = before_eval_key(cfg)
            before = known_before.get(key) if exp.share_before_eval else None
            log.info(
                "experiment %s: arm %s, seed %d -> %s%s",
                exp.name,
                arm,
                seed,
                run_dir,
                " (held-out 'before' known from an earlier arm)" if before else "",
            )
            row = {"arm": arm, "seed": seed, **run_arm(cfg, run_dir, exp.keep_checkpoints, before)}
            evals = json.loads((run_dir / "report.json").read_text())["eval"]
            known_before.setdefault(key, evals["before"])
            if arm != reference:  # the reference arm ran first on this seed
                row.update(paired_cut_precision(out / f"{reference}-s{seed}", run_dir))
            rows.append(row)
            run_dirs.append(run_dir)
            evals_by_arm.setdefault(arm, {})[seed] = {"tries": cfg.eval.tries, **evals}
    write_outputs(out, exp, rows, evals_by_arm)
    if exp.sweep is not None:
        pooled_sweep(out, exp.sweep, run_dirs)
    return out / "experiment.md"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.experiment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", required=True, help="experiment YAML, e.g. configs/experiments/ab_cpu.yaml"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="every arm on the first seed at the smallest size (tiny games, G = 2, one iteration; "
        "default folder runs/experiment-<name>-tiny): checks the command works, in minutes",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build and validate every run's config, print one line per run, train nothing",
    )
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(x) for x in text.split(",")],
        default=None,
        help="comma-separated: run only these of the file's seeds (the outputs cover them); a later "
        "run of more seeds into the same folder reads these runs back instead of training them again",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.dry_run:
            print("\n".join(plan_experiment(args.config, args.out, args.tiny, args.seeds)))
            return 0
        report = run_experiment(args.config, args.out, args.tiny, args.seeds)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
