"""Where the hardware waits: the engines' and the learners' idle shares, and what a run delivered
per hour and per engine-second.

A synchronous iteration is a barrier: the engines idle while the learner trains and the weights
sync, the learner idles while the rollouts play. These figures say how much, from what the run
measured (the engines' busy clocks, the learner's step time, the iteration's wall-clock), so that
a run on GPUs shows what an asynchronous pipeline would win before anyone builds one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def engine_busy_delta(before: Mapping[Any, float], after: Mapping[Any, float]) -> float:
    """Engine-seconds with a request in flight between two readings of every engine's busy clock
    (engine -> ``busy_s``); an engine new since ``before`` (a replacement) counts from zero."""
    return sum(busy - before.get(key, 0.0) for key, busy in after.items())


def idle_metrics(
    engine_busy_s: float, engines: int, learner_busy_s: float, iteration_s: float
) -> dict[str, float]:
    """One iteration's ``system/`` idle figures.

    ``engine_wait_frac``: the share of the engines' seconds with no request in flight (waiting
    for the learner, the weight sync, an environment or the slowest group). ``learner_wait_frac``:
    the share of the iteration outside the learner's optimiser step (rollouts, weight sync,
    evaluation)."""
    if iteration_s <= 0 or engines < 1:
        return {}
    return {
        "system/engine_busy_s": engine_busy_s,
        "system/engines": float(engines),
        "system/learner_busy_s": learner_busy_s,
        "system/engine_wait_frac": max(0.0, 1.0 - engine_busy_s / (engines * iteration_s)),
        "system/learner_wait_frac": max(0.0, 1.0 - learner_busy_s / iteration_s),
    }


def throughput_summary(
    metrics: Sequence[Mapping[str, Any]], informative_trained: int, wall_s: float
) -> dict[str, float] | None:
    """The run's idle shares over all its iterations, informative groups trained per hour,
    trained tokens per engine-second, and the learner's mean step and trained tokens per
    iteration (which side is the long one, and why); None for a log written before the idle
    figures."""
    rows = [m for m in metrics if m.get("iteration", -1) >= 0 and "system/engine_busy_s" in m]
    if not rows or wall_s <= 0:
        return None
    iteration_s = sum(m["system/iteration_s"] for m in rows)
    engine_s = sum(m["system/engines"] * m["system/iteration_s"] for m in rows)
    trained_tokens = sum(m.get("train/tokens", 0.0) for m in rows)
    return {
        "engine_wait_frac": max(0.0, 1.0 - sum(m["system/engine_busy_s"] for m in rows) / engine_s),
        "learner_wait_frac": max(0.0, 1.0 - sum(m["system/learner_busy_s"] for m in rows) / iteration_s),
        "informative_groups_per_hour": informative_trained / (wall_s / 3600.0),
        "trained_tokens_per_engine_s": trained_tokens / engine_s,
        "learner_step_s": sum(m["system/learner_busy_s"] for m in rows) / len(rows),
        "trained_tokens_per_iteration": trained_tokens / len(rows),
    }
