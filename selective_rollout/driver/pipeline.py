"""How rollouts and learner updates interleave (``driver.pipeline``), and which weights play what.

A *policy version* counts the learner's updates. The engines serve one version at a time; a
rollout starts under the version the engines serve, and every group and experience it yields
carries that version (``GroupRecord.policy_version``); each token also carries the version of the
oldest weights its sampling depended on (``Experience.token_versions``), which differs from its
group's only where weights reached the engines mid-rollout.

- ``sync``: an iteration rolls out, trains, then syncs the new weights at once; the engines wait
  while the learner trains and the learner waits while they roll out; every batch is trained at
  the version that played it (staleness 0).
- ``async``: as soon as an iteration's batch is collected, the next iteration's rollout starts
  on the engines, and the learner trains on the collected batch meanwhile (verl's one-step-off
  schedule, with a bound). The weights reach the engines between two rollouts, and only as often
  as ``driver.max_staleness`` needs: the rollout about to start will be trained after the update
  now under way, so it may start under version ``E`` only while ``learner + 1 - E`` stays within
  the bound; otherwise the engines are synced first. Staleness therefore never exceeds the bound,
  and no group is dropped for it.

- ``stream``: the rollout service plays groups without a break and fills batches as they settle
  (``rollout/stream.py``); the learner takes a batch as soon as it is complete while the groups
  started meanwhile play on. A group starts only within the bound (AReaL's rule) and one that
  settles beyond it is dropped as STALE, counted; the weights are sent while groups play, as soon
  as the engines lag the learner by ``driver.max_staleness`` (every update at bound 1), since the
  stream never pauses for them.

In ``async``, by default weights never move while a rollout is in flight, so a group is played under one
version throughout. With ``driver.sync_in_flight`` (async only) each update is sent to the engines
as soon as it is made, while the next rollout plays: its later turns (on vLLM, which recomputes a
reply's KV, its later tokens too) are sampled by the newer weights, so staleness stays at most one
update whatever the bound, at the price of a sync per update. Evaluation first lets the rollout in
flight finish (its batch is kept for its iteration), then syncs, so that it always scores the
learner's latest weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from selective_rollout.rollout.source import RolloutBatch

Start = Callable[[int, int, int], Any]  # (iteration, task cursor, version) -> a handle on the rollout
Wait = Callable[[Any, int], RolloutBatch]  # (handle, iteration) -> its batch
Take = Callable[[int, int], RolloutBatch]  # stream: (iteration, learner version) -> its batch
Sync = Callable[[int], float]  # send the learner's weights (this policy version) to the engines; seconds


@dataclass
class Collected:
    """One iteration's batch, with the version that played it and how long the driver waited."""

    iteration: int
    batch: RolloutBatch
    version: int
    wait_s: float


@dataclass
class _InFlight:
    iteration: int
    handle: Any
    version: int


class RolloutPipeline:
    """The driver's rollouts over one run: what is in flight, under which version, and when the
    engines must be synced. The rollout, wait and sync themselves are callables, so the schedule
    is tested without Ray."""

    def __init__(
        self,
        kind: Literal["sync", "async", "stream"],
        max_staleness: int,
        start: Start,
        wait: Wait,
        sync: Sync,
        version: int,
        cursor: int,
        sync_in_flight: bool = False,
        take_stream: Take | None = None,
    ) -> None:
        """``version``: the learner's, which the engines serve at this point (they were just
        synced); ``cursor``: the task stream's position of the next rollout; ``sync_in_flight``:
        send every update at once, a rollout in flight or not (``driver.sync_in_flight``);
        ``take_stream``: how a ``stream`` pipeline takes a batch (``start`` and ``wait`` serve the
        other two)."""
        if kind == "stream" and take_stream is None:
            raise ValueError("a stream pipeline needs take_stream")
        self.kind, self.max_staleness, self.sync_in_flight = kind, max_staleness, sync_in_flight
        self._start, self._wait, self._sync, self._take_stream = start, wait, sync, take_stream
        self.learner_version = self.engine_version = version
        self.cursor = cursor
        self._in_flight: _InFlight | None = None
        self._ready: Collected | None = None
        self.syncs, self.sync_s = 0, 0.0  # since ``take_syncs``
        self._mixed = False  # a replaced engine serves newer weights than the others

    def take(self, iteration: int) -> Collected:
        """This iteration's batch: the one prefetched for it, rolled out now, or the stream's.
        A stream's batch carries the oldest version among its trained groups."""
        if self._take_stream is not None:
            started = time.perf_counter()
            batch = self._take_stream(iteration, self.learner_version)
            versions = [g.policy_version for g in batch.groups if g.trained_on]
            oldest = min(versions, default=self.engine_version)
            return Collected(iteration, batch, oldest, time.perf_counter() - started)
        if self._ready is not None and self._ready.iteration == iteration:
            ready, self._ready = self._ready, None
            return ready
        if self._in_flight is None or self._in_flight.iteration != iteration:
            self._launch(iteration, ahead=0)
        return self._collect()

    def prefetch(self, iteration: int) -> None:
        """``async``: start ``iteration``'s rollout now, before the learner trains on the batch
        just taken (its update is counted as under way). ``sync``: nothing."""
        if self.kind == "async" and self._in_flight is None and self._ready is None:
            self._launch(iteration, ahead=1)

    def updated(self) -> None:
        """The learner took an update: ``sync`` and ``sync_in_flight`` send it to the engines at
        once (the latter while a rollout may be in flight); ``async`` leaves it to the next
        rollout's start (or an evaluation); ``stream`` sends it, groups in flight, once the
        engines lag by the bound (the stream starts no group beyond it)."""
        self.learner_version += 1
        lag = self.learner_version - self.engine_version
        if (
            self.kind == "sync"
            or self.sync_in_flight
            or (self.kind == "stream" and lag >= self.max_staleness)
        ):
            self._sync_engines()

    def serve_latest(self) -> None:
        """Before an evaluation: let the rollout in flight finish (its batch is kept for its
        iteration), then sync the engines if they lag the learner."""
        if self._in_flight is not None:
            self._ready = self._collect()
        if self.engine_version < self.learner_version:
            self._sync_engines()

    def engines_replaced(self) -> None:
        """A dead engine was replaced and loaded the learner's latest weights, so the engines no
        longer serve one version: the next rollout starts after a sync, whatever the bound says
        (groups already retried on the replacement carry their rollout's version, though played
        with newer weights; their importance weights use that engine's own log-probs). A stream,
        which has no next rollout, syncs now."""
        if self.kind == "stream":
            self._sync_engines()
        else:
            self._mixed = True

    def take_syncs(self) -> tuple[int, float]:
        """Syncs done and seconds they took since the last call (an iteration's)."""
        taken = (self.syncs, self.sync_s)
        self.syncs, self.sync_s = 0, 0.0
        return taken

    def _launch(self, iteration: int, ahead: int) -> None:
        """Start a rollout; its batch is trained after ``ahead`` more updates at most."""
        bound = self.max_staleness if self.kind == "async" else 0
        if self.learner_version + ahead - self.engine_version > bound or self._mixed:
            self._sync_engines()
        handle = self._start(iteration, self.cursor, self.engine_version)
        self._in_flight = _InFlight(iteration, handle, self.engine_version)

    def _collect(self) -> Collected:
        assert self._in_flight is not None
        flight, self._in_flight = self._in_flight, None
        started = time.perf_counter()
        batch = self._wait(flight.handle, flight.iteration)
        self.cursor += batch.tasks_consumed
        return Collected(flight.iteration, batch, flight.version, time.perf_counter() - started)

    def _sync_engines(self) -> None:
        self.sync_s += self._sync(self.learner_version)
        self.syncs += 1
        self.engine_version = self.learner_version
        self._mixed = False
