"""The statistics of an experiment: per metric the paired difference of each arm against the
reference over seeds with its bootstrap CI, and the held-out change pooled over seeds with its CI
over tasks."""

from __future__ import annotations

from typing import Any

import numpy as np

from selective_rollout.analysis.experiment.schema import METRICS
from selective_rollout.analysis.policy_eval import per_task_changes
from selective_rollout.stats import bootstrap_ci, cluster_bootstrap_ci

# Metrics that are themselves signed changes, or a loss whose reference may sit at zero (a sync
# run's ratio is exactly 1 at one step per batch): a difference of them relative to the
# reference's value divides by something near zero or negative (+0.125 over -0.083 read "-150%").
NO_RELATIVE = {"success_gain", "success_gain_ci_low", "loss_abs_max"}


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
            row["vs_reference"] = held_out_difference(changes, arm, reference, resamples)
        out.append(row)
    return [r for r in out if r["pairs"]]


def held_out_difference(
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


def paired_values(
    rows: list[dict[str, Any]], arm: str, ref: str, key: str
) -> tuple[list[float], list[float]]:
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
            diffs, base = paired_values(rows, arm, ref, key)
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
