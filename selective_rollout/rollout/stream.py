"""The rollout side of ``driver.pipeline=stream``: groups played without a break, batches filled
in the order groups settle.

A sync or async rollout is one call per iteration that waits for its slowest group; meanwhile
the slots its settled groups freed stay empty. Here the rollout source plays groups from the task
stream continuously, up to ``rollout.max_groups_in_flight`` at once, and every settled group joins
the batch being filled: the iteration whose batch is not yet complete. A batch is complete with
``rollout.groups_per_iteration`` trainable groups (or, as in a sync rollout, once its cap of
started groups or its window of tasks is spent); the learner takes it (``take``) while the groups
started meanwhile play on, so a slot a cut frees goes at once to a group of a later batch.

**Staleness bound (AReaL's rule).** A batch is trained at the learner version its take reports;
the batches after it at one version more each (a projection: an update the learner skips makes
the truth smaller, never larger). A group is started only while the batch it would land in, were
every group ahead of it trainable (and the batch being filled closed by its cap of started groups
or its window of tasks where those are nearer), would train within ``max_staleness`` versions of
the weights the engines serve now. Groups settle out of order, so a long group can still land in a later batch
than that: when it settles, a trainable group whose projected lag exceeds the bound is dropped as
STALE (logged and counted, ``rollout/groups_stale``), and no trained token is ever older than the
bound.

**The log and a resume.** A batch's records (its cut, filtered, failed, skipped and stale groups
and its trainable ones, in the order they settled) are written when the learner takes it, under
its iteration, so the log holds whole batches only, and ``rewind_logs`` rewinds it by iteration as
for the other pipelines. Groups settled in a batch not yet taken, or still running, are lost with
a killed driver and played again on resume: each task carries its stream index (a record's
``meta.stream_index``), a take reports the indices its batch settled, and the driver's checkpoint
keeps the lowest index not yet settled plus the settled ones above it (``advance``), so a resumed
stream passes over exactly those.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from selective_rollout.records import GroupRecord, Outcome, Task
from selective_rollout.rollout.scheduler import cancel_all
from selective_rollout.rollout.source import RolloutBatch

if TYPE_CHECKING:
    from selective_rollout.rollout.group_run import GroupRun
    from selective_rollout.rollout.scheduler import GroupScheduler


@dataclass(frozen=True)
class StreamStart:
    """Where a stream starts: the driver's side of ``RolloutService.open_stream``.

    ``tasks`` shuffled by ``shuffle_seed`` make the task stream (``runtime.task_stream``); it is
    played from index ``cursor`` on, passing over the ``settled`` indices above it (a resumed
    run). Batches ``first_iteration`` to ``last_iteration`` are filled; the first trains at the
    learner's ``version``, which the engines serve when the stream opens."""

    tasks: list[Task]
    shuffle_seed: int
    cursor: int
    settled: list[int]
    first_iteration: int
    last_iteration: int
    version: int
    max_staleness: int


@dataclass
class _Batch:
    """What has settled into one iteration's batch so far."""

    records: list[GroupRecord] = field(default_factory=list)
    kept: list[GroupRun] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)  # stream indices whose tasks settled here
    started: int = 0  # groups settled here (skipped tasks are not groups)
    complete: bool = False


class GroupStream:
    """Plays groups from ``tasks`` (the task stream from ``start.cursor`` on) without a break and
    hands out whole batches (``take``); no group is started for a batch after
    ``start.last_iteration``."""

    def __init__(self, source: GroupScheduler, tasks: Iterator[Task], start: StreamStart) -> None:
        self.source = source
        self.max_staleness, self.last_iteration = start.max_staleness, start.last_iteration
        cursor, first_iteration, version = start.cursor, start.first_iteration, start.version
        rc = source.rc
        self.target = rc.groups_per_iteration
        self.cap = self.target if not rc.refill else max(self.target, int(self.target * rc.max_groups_factor))
        self.window = int(self.target * rc.max_groups_factor) + 1  # tasks per batch, skips included
        passed = set(start.settled)
        self._tasks = ((i, t) for i, t in enumerate(tasks, start=cursor) if i not in passed)
        self._retries: list[tuple[int, Task]] = []
        self._retried: set[int] = set()  # stream indices whose task was played again
        self._batches: dict[int, _Batch] = {first_iteration: _Batch()}
        self._filling = self._next_take = first_iteration
        self._base = version  # the learner version batch ``_next_take`` trains at
        self._running: dict[asyncio.Task, tuple[int, Task, GroupRun]] = {}
        self._wake, self._changed = asyncio.Event(), asyncio.Event()
        self._error: BaseException | None = None
        self._since = (time.perf_counter(), source.turns.tokens, source.turns.env_steps)
        source.version = version
        self._player = asyncio.create_task(self._play())
        self._player.add_done_callback(lambda _: self._changed.set())  # a take waiting learns of it

    # ------------------------------------------------------------------ the learner's side
    async def take(self, iteration: int, learner_version: int) -> RolloutBatch:
        """Batch ``iteration`` once complete, to be trained at ``learner_version``; its records are
        logged now. The groups playing meanwhile go on."""
        if iteration != self._next_take:
            raise RuntimeError(f"the stream hands out batch {self._next_take} next, not {iteration}")
        while not self._batches[iteration].complete:
            if self._error is not None:
                raise self._error
            if self._player.done():
                error = None if self._player.cancelled() else self._player.exception()
                raise RuntimeError(
                    f"the group stream stopped before batch {iteration} was complete: {error!r}"
                ) from error
            self._changed.clear()
            await self._changed.wait()
        batch = self._batches.pop(iteration)
        for record in batch.records:
            self.source.write(record)
        started, tokens, steps = self._since
        metrics = self.source.batch_metrics(batch.records, time.perf_counter() - started, tokens, steps)
        self._since = (time.perf_counter(), self.source.turns.tokens, self.source.turns.env_steps)
        self._next_take, self._base = iteration + 1, learner_version + 1
        self._wake.set()  # the bound moved on: more groups may start
        experiences = [e for g in batch.kept for e in g.experiences()]
        kept_ids = [g.group_id for g in batch.kept]
        return RolloutBatch(experiences, batch.records, metrics, 0, kept_ids, stream_indices=batch.indices)

    async def close(self) -> None:
        """Stop playing: the groups in flight are cancelled, unsettled batches never logged."""
        self._player.cancel()
        await asyncio.gather(self._player, return_exceptions=True)
        await cancel_all(self._running)
        self._running.clear()

    def weights_updated(self) -> None:
        """The engines serve newer weights: groups blocked by the bound may start now."""
        self._wake.set()

    # ------------------------------------------------------------------ playing
    async def _play(self) -> None:
        slots = self.source.turns.slots
        while True:
            self._wake.clear()
            self._start_groups()
            if not self._running and not slots.live() and self._filling <= self.last_iteration:
                await slots.wait_for_replacement()
                continue
            await self._wake.wait()
            for fut in [f for f in self._running if f.done()]:
                self._group_ended(fut)
                if self._error is not None:
                    await cancel_all(self._running)
                    self._running.clear()
                    return

    def _start_groups(self) -> None:
        """Start groups while a slot is free and the bound allows one more."""
        while len(self._running) < self.source.in_flight and self.source.turns.slots.live():
            landing = self._landing()
            if (
                landing > self.last_iteration
                or self._projected(landing) - self.source.version > self.max_staleness
            ):
                return
            if self._retries:
                index, task = self._retries.pop(0)
            else:
                index, task = next(self._tasks)
                refused = self.source.refusal(task, self._filling)
                if refused is not None:
                    self._place(index, refused, None)
                    continue
            fut, group = self.source.launch(task, self._filling)
            fut.add_done_callback(lambda _: self._wake.set())
            self._running[fut] = (index, task, group)

    def _group_ended(self, fut: asyncio.Task) -> None:
        index, task, group = self._running.pop(fut)
        try:
            retry = self.source.note_end(fut, task, group, self._retried, index)
        except BaseException as exc:  # not a dead worker: the take that waits raises it
            self._error = exc
            self._changed.set()
            return
        batch = self._filling
        record, trained = self.source.settle(
            task,
            group,
            batch,
            too_stale=lambda g: self._projected(batch) - g.policy_version > self.max_staleness,
        )
        if retry:
            self._retries.append((index, task))
        else:
            self._retried.discard(index)  # its last try: the index is never played again
        self._place(index, record, group if trained else None, settled=not retry)

    def _place(self, index: int, record: GroupRecord, kept: GroupRun | None, settled: bool = True) -> None:
        """A settled group (or a skipped task) joins the batch being filled, which may complete;
        ``settled`` is False for a failed group whose task is played again."""
        record.meta["stream_index"] = index
        batch = self._batches[self._filling]
        batch.records.append(record)
        if settled:
            batch.indices.append(index)
        batch.started += record.outcome is not Outcome.SKIPPED
        if kept is not None:
            batch.kept.append(kept)
        if len(batch.kept) >= self.target or batch.started >= self.cap or len(batch.records) >= self.window:
            batch.complete = True
            self._filling += 1
            self._batches[self._filling] = _Batch()
            self._changed.set()

    def _landing(self) -> int:
        """The batch a group started now lands in, were every group ahead of it trainable: the
        latest it can land, but for groups started after it settling first. The batch being
        filled has room for fewer groups than its target lacks when its cap of started groups or
        its window of tasks is nearer; every later batch for ``target``."""
        batch = self._batches[self._filling]
        room = min(self.target - len(batch.kept), self.cap - batch.started, self.window - len(batch.records))
        ahead = len(self._running)
        if ahead < room:
            return self._filling
        return self._filling + 1 + (ahead - room) // self.target

    def _projected(self, iteration: int) -> int:
        """The learner version batch ``iteration`` trains at (one update per batch taken)."""
        return self._base + iteration - self._next_take


def advance(cursor: int, settled: Iterable[int], taken: Iterable[int]) -> tuple[int, list[int]]:
    """The stream's position after a take: the lowest index not yet settled, and the settled ones
    above it (``settled``: before the take; ``taken``: the indices the batch settled)."""
    ahead = set(settled) | set(taken)
    while cursor in ahead:
        ahead.discard(cursor)
        cursor += 1
    return cursor, sorted(ahead)
