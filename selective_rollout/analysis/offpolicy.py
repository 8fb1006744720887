"""How far behind the learner a run's batches were played, and what the correction weighed.

Built from the iterations' ``offpolicy/*`` and ``pipeline/*`` metrics (``LearnerGroup.train_step``
and the driver's pipeline) and the groups' policy versions; the report's "pipeline", "groups by
version lag" and "importance weights" rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from selective_rollout.records import GroupRecord, Outcome

LAG_PREFIX = "offpolicy/groups_lag_"


def offpolicy_summary(metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Groups trained at each lag, weight syncs, the learner's wait for rollouts, and the stale
    tokens' importance weights (token-weighted over the run); None for a log without them."""
    rows = [m for m in metrics if m.get("iteration", -1) >= 0 and "pipeline/staleness" in m]
    if not rows:
        return None
    lags: dict[int, int] = {}
    for m in rows:
        for key, value in m.items():
            if key.startswith(LAG_PREFIX):
                lag = int(key[len(LAG_PREFIX) :])
                lags[lag] = lags.get(lag, 0) + int(value)
    stale = [
        m["offpolicy/stale_token_frac"] * m["train/policy_tokens"] for m in rows if "offpolicy/is_mean" in m
    ]
    weighted = [m for m in rows if "offpolicy/is_mean" in m]
    tokens = sum(stale)
    summary: dict[str, Any] = {
        "groups_by_lag": dict(sorted(lags.items())),
        # every line's syncs: an async run's last one is logged on the final evaluation's line
        "syncs": int(sum(m.get("pipeline/syncs", 0.0) for m in metrics if m.get("iteration", -1) >= 0)),
        "rollout_wait_s": sum(m["pipeline/rollout_wait_s"] for m in rows),
        "stale_tokens": tokens,
        "policy_tokens": sum(m.get("train/policy_tokens", 0.0) for m in rows),
    }
    if tokens:
        summary.update(
            {
                "is_mean": sum(m["offpolicy/is_mean"] * n for m, n in zip(weighted, stale, strict=True))
                / tokens,
                "is_max": max(m["offpolicy/is_max"] for m in weighted),
                "is_truncated_frac": sum(
                    m["offpolicy/is_truncated_frac"] * n for m, n in zip(weighted, stale, strict=True)
                )
                / tokens,
                "ess_min": min(m["offpolicy/ess"] for m in weighted),
                "is_applied": all(m.get("offpolicy/is_applied", 1.0) for m in weighted),
            }
        )
    return summary


def outcomes_by_lag(
    groups: Sequence[GroupRecord], metrics: Sequence[Mapping[str, Any]]
) -> dict[int, dict[str, int]]:
    """Per version lag (the learner's version when the group's iteration trained, minus the
    version that played it): groups started, cut, audited and trained. The gate decides on groups
    of every lag alike; this says what it did at each. ``dropped``: trainable groups the stream
    pipeline dropped because their lag exceeded the bound (STALE)."""
    learner = {
        int(m["iteration"]): int(m["pipeline/learner_version"])
        for m in metrics
        if "pipeline/learner_version" in m
    }
    by_lag: dict[int, Counter[str]] = {}
    for g in groups:
        if g.iteration not in learner or g.outcome is Outcome.SKIPPED:
            continue
        counts = by_lag.setdefault(learner[g.iteration] - g.policy_version, Counter())
        counts["started"] += 1
        counts["cut"] += g.outcome is Outcome.CUT
        counts["audited"] += g.outcome is Outcome.AUDITED
        counts["trained"] += g.trained_on
        counts["dropped"] += g.outcome is Outcome.STALE
    return {
        lag: {k: counts[k] for k in ("started", "cut", "audited", "trained", "dropped")}
        for lag, counts in sorted(by_lag.items())
    }


def offpolicy_rows(
    summary: dict[str, Any] | None,
    pipeline: str,
    max_staleness: int,
    by_lag: dict[int, dict[str, int]] | None = None,
) -> list[str]:
    """The report's rows on the pipeline, the gate's outcomes by version lag and the importance
    weights."""
    if summary is None:
        return ["| pipeline | not recorded (a run logged before pipeline/* metrics) |"]
    bound = f"staleness bound {max_staleness}" if pipeline != "sync" else "staleness 0 by construction"
    lags = ", ".join(f"lag {lag}: {n}" for lag, n in summary["groups_by_lag"].items()) or "no group trained"
    rows = [
        f"| pipeline | {pipeline} ({bound}); groups of the trained batches by version lag: {lags}; "
        f"weight syncs: {summary['syncs']}; "
        f"the learner waited {summary['rollout_wait_s']:.0f} s for rollouts |"
    ]
    if by_lag:
        counts = "; ".join(
            f"lag {lag}: " + ", ".join(f"{n} {what}" for what, n in c.items()) for lag, c in by_lag.items()
        )
        rows.append(f"| groups by version lag | {counts} |")
    if "is_mean" not in summary:
        return [
            *rows,
            "| importance weights | none: every trained token was sampled by the learner's weights |",
        ]
    share = summary["stale_tokens"] / max(summary["policy_tokens"], 1.0)
    applied = "" if summary["is_applied"] else " (measured, not applied: the policy loss ignores them)"
    return [
        *rows,
        f"| importance weights | {share:.0%} of trained tokens stale; weight mean {summary['is_mean']:.3f}, "
        f"max {summary['is_max']:.2f}, {summary['is_truncated_frac']:.2%} truncated; smallest effective "
        f"sample size {summary['ess_min']:.0%}{applied} |",
    ]
