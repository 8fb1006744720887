"""A group of G samples of one prompt, running concurrently, watched by a gate.

Trainers outside this package's coordinator (OpenRLHF) and inference loops (best-of-N) run each sample as
its own coroutine with no view of its siblings. ``LiveGroup`` is the shared view: every sample
reports its environment actions, and the gate is asked at step s as soon as each live sample
has taken s actions, with no barrier, so fast samples never wait for slow ones (the schedule is
``gate.GateWatch``'s, the same as the coordinator's groups follow). When the gate
fires, samples are cut (all of them for training, all but ``survivors`` for inference) and a
cut sample's pending generation is cancelled, which in vLLM aborts the request. The group's fate
is its ``GroupLifecycle`` (``selective_rollout.lifecycle``), the one the coordinator's groups
settle through: a stop here is acted on at once (CUT, never audited).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from selective_rollout.gate import Gate, GateWatch
from selective_rollout.lifecycle import GroupLifecycle
from selective_rollout.records import GateRecord

T = TypeVar("T")


class LiveGroup:
    """Cut flags of G concurrent samples over a ``GateWatch`` of their actions; decides once, cuts once."""

    def __init__(self, gate: Gate, g: int, survivors: int = 0) -> None:
        if g < 2:
            raise ValueError(f"a gated group needs G >= 2 samples, got {g}")
        if not 0 <= survivors < g:
            raise ValueError(f"survivors must be in [0, G-1] = [0, {g - 1}], got {survivors}")
        self.gate, self.g, self.survivors = gate, g, survivors
        self.watch = GateWatch(gate, g)
        self.life = GroupLifecycle()
        self.cut = [False] * g
        self.aborted = [False] * g  # a cut sample whose request was in flight, and so cancelled
        self._cut_events = [asyncio.Event() for _ in range(g)]

    @property
    def actions(self) -> list[list[str]]:
        return self.watch.actions

    @property
    def ended(self) -> list[bool]:
        return self.watch.ended

    @property
    def fired(self) -> bool:
        return self.life.stopped

    @property
    def decision(self) -> GateRecord | None:
        """The decision that stopped the group (None while it runs on)."""
        return self.watch.decision if self.fired else None

    @property
    def cut_step(self) -> int | None:
        return self.decision.step if self.decision is not None else None

    def record(self, i: int, action: str) -> None:
        """Sample i took ``action`` in the environment."""
        self._cut_if(self.watch.act(i, action))

    def end(self, i: int) -> None:
        """Sample i is over (finished, truncated or cut); it is END-padded from now on."""
        self._cut_if(self.watch.end(i))
        if all(self.ended):
            self.life.trajectories_ended()

    def _cut_if(self, stop: GateRecord | None) -> None:
        """Cut the samples still live when the gate fired, keeping the first ``survivors``."""
        if stop is None:
            return
        self.life.gate_fired()
        self.life.audit_decided(audit=False)
        live = [i for i in range(self.g) if not self.ended[i]]
        for i in live[self.survivors :]:
            self.cut[i] = True
            self._cut_events[i].set()

    async def unless_cut(self, i: int, work: Awaitable[T]) -> T | None:
        """Await ``work`` for sample i; if the sample is cut first, cancel it and return None.

        Cancelling the task is how the request is aborted: vLLM's ``AsyncLLM.generate`` aborts
        its request when the coroutine iterating it is cancelled; an HTTP client closes the
        connection.
        """
        if self.cut[i]:
            if asyncio.iscoroutine(work):
                work.close()
            return None
        task = asyncio.ensure_future(work)
        cut = asyncio.ensure_future(self._cut_events[i].wait())
        try:
            await asyncio.wait([task, cut], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            cut.cancel()
        if task.done():
            return task.result()
        task.cancel()
        self.aborted[i] = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
