"""Held-out evaluation offline: the paired change between two evaluations with an exact test, and
a policy's held-out success with its CI (``driver.held_out.success_summary``, what a run logs at
each evaluation). As a CLI it evaluates any HF model folder (an SFT warm start, an exported
policy, a hub model on machines that have it), or a training run's policy (its latest checkpoint,
exported on the way: ``learner/export.py``):

    python -m selective_rollout.analysis.policy_eval --checkpoint DIR --split valid_unseen \\
        [--tries 3 --sampled]
    python -m selective_rollout.analysis.policy_eval --checkpoint runs/train-cpu --num-tasks 24 \\
        --tries 4 --sampled
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selective_rollout.config import ConfigError, RunConfig, load_config
from selective_rollout.driver.held_out import format_summary, success_summary
from selective_rollout.stats import bootstrap_ci, newcombe_paired_ci, sign_flip_p


def success_gain(
    before: dict[str, Any], after: dict[str, Any], resamples: int = 1000, seed: int = 0
) -> dict[str, Any] | None:
    """After minus before on the same held-out tasks, paired per task: whether training moved
    held-out success, not just whether two numbers differ.

    The test is exact at any size (a sign-flip test over tasks; on one try per task, McNemar's
    exact test on the tasks that flipped). The interval is Newcombe's paired score interval when
    every task's outcome is 0/1 (one try, or tries that agree), which stays honest at a handful of
    tasks; with fractional per-task rates, a bootstrap over tasks."""
    changes = per_task_changes(before, after)
    if not changes:
        return None
    diffs = list(changes.values())
    b, a = before["per_task"], after["per_task"]
    if all(b[t] in (0.0, 1.0) and a[t] in (0.0, 1.0) for t in changes):
        counts = Counter((b[t], a[t]) for t in changes)
        lo, hi = newcombe_paired_ci(counts[1.0, 1.0], counts[1.0, 0.0], counts[0.0, 1.0], counts[0.0, 0.0])
        interval = "paired score (Newcombe)"
    else:
        lo, hi = bootstrap_ci(diffs, resamples, seed)
        interval = "bootstrap over tasks"
    return {
        "mean": float(np.mean(diffs)),
        "ci95": [lo, hi],
        "interval": interval,
        "p_value": sign_flip_p(diffs, seed=seed),
        "tasks": len(diffs),
        "improved": sum(d > 0 for d in diffs),
        "worsened": sum(d < 0 for d in diffs),
        "try_correlation": try_correlation(before, after),
    }


def describe_gain(gain: dict[str, Any], level: float = 0.05) -> str:
    """The paired change in words: what moved, how sure, and plainly when it cannot tell."""
    lo, hi = gain["ci95"]
    unchanged = gain["tasks"] - gain["improved"] - gain["worsened"]
    evidence = (
        f"{gain['improved']} task(s) improved, {gain['worsened']} worsened, {unchanged} unchanged; "
        f"exact paired test p = {gain['p_value']:.2f}; 95% CI {lo:+.1%}..{hi:+.1%}, {gain['interval']}"
    )
    if gain["p_value"] >= level:
        verdict = "indistinguishable from no change"
    else:
        verdict = "a gain" if gain["mean"] > 0 else "a loss"
    return f"{gain['mean']:+.1%}: {verdict} ({evidence})"


def paired_tries(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[list[int], list[int]]]:
    """Per task both summaries played every try of: its (before, after) outcomes in try order
    (paired by try index: the same sampling seeds); empty for summaries that predate ``per_try``."""
    b, a = before.get("per_try", {}), after.get("per_try", {})
    return {
        task: (b[task], a[task])
        for task in sorted(b.keys() & a.keys())
        if len(a[task]) == len(b[task]) and None not in a[task] and None not in b[task]
    }


def per_try_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[int]]:
    """After minus before outcome per try, per task both summaries played every try of."""
    return {
        task: [x - y for x, y in zip(a, b, strict=True)]
        for task, (b, a) in paired_tries(before, after).items()
    }


def try_correlation(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """How alike a try's before and after outcomes are beyond their task's rates: the correlation,
    pooled over tasks, of the two outcomes' deviations from their task's mean over tries. 0 when
    the shared sampling seeds pair nothing (the paired change then carries both evaluations'
    sampling noise), 1 when every try repeats its outcome. None without per-try outcomes or
    without variation."""
    pairs = paired_tries(before, after).values()
    if not pairs:
        return None
    dev_b = np.concatenate([np.subtract(b, np.mean(b)) for b, _ in pairs])
    dev_a = np.concatenate([np.subtract(a, np.mean(a)) for _, a in pairs])
    scale = float(np.sqrt((dev_b**2).sum() * (dev_a**2).sum()))
    return float((dev_b * dev_a).sum() / scale) if scale > 0 else None


def per_task_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """After minus before success per held-out task, over the tasks both summaries scored."""
    b, a = before.get("per_task", {}), after.get("per_task", {})
    return {task: a[task] - b[task] for task in sorted(b.keys() & a.keys())}


def run_evaluation(cfg: RunConfig, model_path: str | Path) -> dict[str, Any]:
    """Start Ray (or join RAY_ADDRESS), one engine on ``model_path``, and evaluate ``cfg.eval``."""
    import ray

    from selective_rollout.rollout.coordinator import create_coordinator
    from selective_rollout.rollout.engines import create_engines
    from selective_rollout.runtime import held_out_tasks, init_ray, wait_for_coordinator

    init_ray(None)
    tasks = held_out_tasks(cfg)
    engines = create_engines(cfg.engine, Path(model_path), cfg.engine.num_engines)
    coordinator = create_coordinator(cfg, engines, model_path, None)
    try:
        ref = coordinator.evaluate.remote(tasks)
        groups = wait_for_coordinator(coordinator, ref, "evaluation", cfg.driver.stall_timeout_s)
    finally:
        ray.get(coordinator.shutdown.remote(), timeout=60)
        ray.get([e.shutdown.remote() for e in engines], timeout=60)
    return success_summary(groups, cfg.eval.bootstrap, cfg.seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.analysis.policy_eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="HF model folder, model alias, or a training run folder / iter_* checkpoint (exported first)",
    )
    parser.add_argument(
        "--config", default=None, help="default: a run's own config.yaml, else configs/cpu_default.yaml"
    )
    parser.add_argument(
        "--split",
        default=None,
        help="one of the environment's own splits (eval.split; alfworld: valid_unseen...)",
    )
    parser.add_argument("--num-tasks", type=int, default=None)
    parser.add_argument("--tries", type=int, default=None)
    parser.add_argument(
        "--sampled", action="store_true", help="sample at the engine temperature instead of greedy"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the summary as JSON here")
    parser.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. env.games_dir=data/games/tiny"
    )
    args = parser.parse_args(argv)
    extra = [
        f"eval.{k}={v}"
        for k, v in (("split", args.split), ("num_tasks", args.num_tasks), ("tries", args.tries))
        if v is not None
    ]
    if args.sampled:
        extra.append("eval.greedy=false")
    try:
        from selective_rollout.learner.export import export_run, run_folder_of

        run = run_folder_of(args.checkpoint)
        config = args.config or (run / "config.yaml" if run else "configs/cpu_default.yaml")
        cfg = load_config(config, [*args.overrides, *extra])
        with tempfile.TemporaryDirectory(prefix="policy-") as exported:
            if run:
                model_path = export_run(args.checkpoint, exported)
            else:
                from selective_rollout.models import resolve_model

                model_path = resolve_model(args.checkpoint, cfg.engine.model_cache_dir)
            summary = run_evaluation(cfg, model_path)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
