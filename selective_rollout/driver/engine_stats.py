"""What the engines' counters say about an interval: prompt-cache use and busy time."""

from __future__ import annotations

from typing import Any


def cache_metrics(
    before: dict[Any, tuple[int, int]], after: dict[Any, tuple[int, int]], env_steps: float
) -> dict[str, float]:
    """What the engines' prompt caches did between two ``engine_counters`` readings: the share of
    prompt tokens served from cache and the tokens prefilled per env step. A multi-turn dialogue
    should prefill about one turn's new tokens a step; its whole length means a bypassed cache.
    An engine that is new since ``before`` (a replacement) counts from zero."""
    cached = prefilled = 0
    for key, (c, f) in after.items():
        c0, f0 = before.get(key, (0, 0))
        cached, prefilled = cached + c - c0, prefilled + f - f0
    if cached + prefilled <= 0:
        return {}
    return {
        "system/prefix_cache_hit_rate": cached / (cached + prefilled),
        "system/prefilled_tokens_per_env_step": prefilled / env_steps if env_steps else 0.0,
    }


def engine_counters(healths: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each engine's (prompt tokens served from cache, prompt tokens prefilled) so far."""
    return {
        k: (int(h.get("cached_tokens", 0)), int(h.get("prefilled_tokens", 0))) for k, h in healths.items()
    }


def engine_busy(healths: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each engine's busy clock so far (seconds with a request in flight)."""
    return {k: float(h.get("busy_s", 0.0)) for k, h in healths.items()}
