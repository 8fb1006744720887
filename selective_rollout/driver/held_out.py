"""The held-out summaries the driver logs at each evaluation: success rate overall and per task
type with a bootstrap 95% CI (``success_summary``, over the groups the coordinator's evaluator
returns: no gate, no filter, greedy or sampled, one or k tries per task), as flat ``eval/`` metrics
and as lines of the log. Comparing two of them is offline analysis
(``selective_rollout.analysis.policy_eval``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from selective_rollout.records import GroupRecord
from selective_rollout.stats import bootstrap_ci


def success_summary(groups: Sequence[GroupRecord], resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Per-task success (mean over its tries), then the mean over tasks, overall and per type."""
    per_task: list[float] = []
    by_task: dict[str, float] = {}
    by_try: dict[str, list[int | None]] = {}
    by_type: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, str] = {}
    for g in groups:
        done = [t for t in g.trajectories if t.reward is not None]
        if not done:
            failed[g.task_id] = str(g.meta.get("failure") or g.meta.get("skipped") or "no finished episode")
            continue
        rate = sum(t.won for t in done) / len(done)
        per_task.append(rate)
        by_task[g.task_id] = rate
        by_try[g.task_id] = [
            None if t.reward is None else int(t.won) for t in sorted(g.trajectories, key=lambda t: t.index)
        ]
        by_type[g.task_type].append(rate)
    lo, hi = bootstrap_ci(per_task, resamples, seed)
    return {
        "success_rate": float(np.mean(per_task)) if per_task else float("nan"),
        "ci95": [lo, hi],
        "tasks": len(per_task),
        "failed_tasks": len(failed),
        "failed": failed,
        "by_type": {
            k: {"success_rate": float(np.mean(v)), "tasks": len(v)} for k, v in sorted(by_type.items())
        },
        "per_task": by_task,
        # each try's outcome in try order: a try of the same task plays with the same sampling
        # seeds in every evaluation, so before and after can be paired try by try
        "per_try": by_try,
    }


def eval_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary as flat ``eval/`` metrics (docs/design.md, metrics)."""
    out = {
        "eval/success_rate": summary["success_rate"],
        "eval/success_ci_low": summary["ci95"][0],
        "eval/success_ci_high": summary["ci95"][1],
        "eval/tasks": float(summary["tasks"]),
    }
    for task_type, s in summary["by_type"].items():
        out[f"eval/success_rate/{task_type}"] = s["success_rate"]
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lo, hi = summary["ci95"]
    lines = [
        f"success {summary['success_rate']:.1%} (95% CI {lo:.1%}..{hi:.1%}) over {summary['tasks']} tasks"
    ]
    lines += [
        f"  {k:<34} {v['success_rate']:6.1%}  ({v['tasks']} tasks)" for k, v in summary["by_type"].items()
    ]
    if summary["failed_tasks"]:
        lines.append(f"  {summary['failed_tasks']} task(s) failed and are not counted:")
        lines += [f"    {task}: {why}" for task, why in summary.get("failed", {}).items()]
    return "\n".join(lines)
