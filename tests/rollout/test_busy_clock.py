"""The engines' busy clock: time with at least one request in flight, overlaps counted once."""

from __future__ import annotations

from selective_rollout.rollout.engines import base
from selective_rollout.rollout.engines.base import BusyClock


def test_overlapping_requests_count_once_and_idle_gaps_not_at_all(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(base.time, "monotonic", lambda: now[0])
    clock = BusyClock()
    clock.enter()  # t=100: a request arrives
    now[0] = 101.0
    clock.enter()  # a second one overlaps the first
    now[0] = 103.0
    clock.leave()
    assert clock.busy_s == 3.0  # still busy: one request left, counted up to now
    now[0] = 104.0
    clock.leave()  # idle from t=104
    now[0] = 110.0  # six idle seconds count for nothing
    assert clock.busy_s == 4.0
    clock.enter()
    now[0] = 112.5
    clock.leave()
    assert clock.busy_s == 6.5
