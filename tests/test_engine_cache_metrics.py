"""The driver's prompt-cache figures, and the vLLM engine's refusal to keep a stale prefix cache."""

from __future__ import annotations

import asyncio

import pytest

from selective_rollout.driver import cache_metrics
from selective_rollout.rollout.engines import EngineError, vllm_engine


def test_cache_metrics_are_the_deltas_between_two_readings():
    before = {"a": (100, 300), "b": (0, 50)}
    after = {"a": (400, 400), "b": (60, 90)}  # a: +300 cached +100 prefilled; b: +60 cached +40
    m = cache_metrics(before, after, env_steps=10)
    assert m["system/prefix_cache_hit_rate"] == pytest.approx(360 / 500)
    assert m["system/prefilled_tokens_per_env_step"] == pytest.approx(14.0)


def test_a_replaced_engine_counts_from_zero_and_an_idle_period_reports_nothing():
    m = cache_metrics({"old": (500, 500)}, {"new": (30, 10)}, env_steps=2)
    assert m == {"system/prefix_cache_hit_rate": 0.75, "system/prefilled_tokens_per_env_step": 5.0}
    assert cache_metrics({"a": (5, 5)}, {"a": (5, 5)}, env_steps=0) == {}


class _HoldingCache:
    """vLLM's AsyncLLM surface for reset_prefix_cache: False while requests hold blocks."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.calls = refusals, 0

    async def reset_prefix_cache(self) -> bool:
        self.calls += 1
        return self.calls > self.refusals


def _engine(cache: _HoldingCache) -> vllm_engine.VLLMEngine:
    engine = object.__new__(vllm_engine.VLLMEngine)  # only what reset_cache reads
    engine.engine, engine._running = cache, {"req-1"}
    return engine


def test_reset_cache_retries_while_blocks_are_held(monkeypatch):
    cache = _HoldingCache(refusals=3)
    asyncio.run(_engine(cache).reset_cache())
    assert cache.calls == 4


def test_reset_cache_refuses_to_go_on_with_a_cache_it_could_not_drop(monkeypatch):
    monkeypatch.setattr(vllm_engine, "RESET_CACHE_WAIT_S", 0.2)
    cache = _HoldingCache(refusals=10**9)
    with pytest.raises(EngineError, match=r"kept its prefix cache .*1 requests running.*not reset"):
        asyncio.run(_engine(cache).reset_cache())
