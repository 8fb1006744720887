"""A group of G samples of one prompt, running concurrently, watched by a gate.

Trainers outside our coordinator (OpenRLHF) and inference loops (best-of-N) run each sample as
its own coroutine with no view of its siblings. ``LiveGroup`` is the shared view: every sample
reports its environment actions, and the gate is asked at step s as soon as each live sample
has taken s actions, with no barrier, so fast samples never wait for slow ones. When the gate
fires, samples are cut (all of them for training, all but ``survivors`` for inference) and a
cut sample's pending generation is cancelled, which in vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from selective_rollout.gate import Gate, GateDecision, GroupState

T = TypeVar("T")


class LiveGroup:
    """Actions, end flags and cut flags of G concurrent samples; decides once, cuts once."""

    def __init__(self, gate: Gate, g: int, survivors: int = 0) -> None:
        if g < 2:
            raise ValueError(f"a gated group needs G >= 2 samples, got {g}")
        if not 0 <= survivors < g:
            raise ValueError(f"survivors must be in [0, G-1] = [0, {g - 1}], got {survivors}")
        self.gate, self.g, self.survivors = gate, g, survivors
        self.actions: list[list[str]] = [[] for _ in range(g)]
        self.ended = [False] * g
        self.cut = [False] * g
        self.decision: GateDecision | None = None  # the decision that stopped the group
        self.cut_step: int | None = None
        self._checked = 0
        self._cut_events = [asyncio.Event() for _ in range(g)]

    @property
    def fired(self) -> bool:
        return self.decision is not None

    def record(self, i: int, action: str) -> None:
        """Sample i took ``action`` in the environment."""
        if self.ended[i]:
            raise ValueError(f"sample {i} has ended; it takes no more actions")
        self.actions[i].append(action)
        self._maybe_decide()

    def end(self, i: int) -> None:
        """Sample i is over (finished, truncated or cut); it is END-padded from now on."""
        if not self.ended[i]:
            self.ended[i] = True
            self._maybe_decide()

    def _maybe_decide(self) -> None:
        if self.fired:
            return
        live = [i for i in range(self.g) if not self.ended[i]]
        if not live:
            return  # everyone finished: nothing left to save
        ready = min(len(self.actions[i]) for i in live)
        while self._checked < ready:
            self._checked += 1
            step = self._checked
            if not self.gate.should_check(step):
                continue
            decision = self.gate.decide(GroupState(self.actions, step=step, ended=list(self.ended)))
            if decision.stop:
                self._fire(decision, step, live)
                return

    def _fire(self, decision: GateDecision, step: int, live: list[int]) -> None:
        self.decision, self.cut_step = decision, step
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
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
