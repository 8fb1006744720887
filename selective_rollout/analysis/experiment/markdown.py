"""An experiment's outputs: ``experiment.csv`` (one row per arm and seed), ``experiment.md`` (the
tables of ``tables``, the seeds the cost per informative group would take, how precisely the held-out
change was measured) and ``experiment.png`` (``plots``)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from selective_rollout.analysis.experiment.plots import plot
from selective_rollout.analysis.experiment.schema import METRICS, ExperimentConfig
from selective_rollout.analysis.experiment.tables import (
    held_out_changes,
    held_out_difference,
    paired_differences,
    paired_values,
    pooled_held_out,
)
from selective_rollout.analysis.policy_eval import per_try_changes
from selective_rollout.analysis.power import MAX_SEEDS, change_precision, paired_seeds_needed

# Precisions over audits: an arm's figure pools its seeds' audits (right / audited) rather than
# averaging the seeds' ratios, where one seed's single audit would weigh as much as another's ten
POOLED = {
    "audit_precision": ("audits_right", "audits"),
    "trajectory_label_precision": ("trajectory_labels_right", "trajectory_stops_audited"),
}


# What an informative group costs: the gate's saving, measured where it is spent
COST_METRICS = ("step_tokens_per_informative", "rollout_s_per_informative")


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
    differences measured here (``analysis.power.paired_seeds_needed``). No lines with fewer than
    2 seeds."""
    ref, out = arms[0], []
    for arm in arms[1:]:
        for key in COST_METRICS:
            diffs, base = paired_values(rows, arm, ref, key)
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
        "of the paired differences measured here (`selective_rollout/analysis/power.py`; an order "
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
            d = held_out_difference(changes, arm, other, resamples)
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
    sampling's and the seeds' variance (``analysis.power``), and the seeds a CI excluding 0
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
        "from these runs (`selective_rollout/analysis/power.py`); at this design the model's "
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
