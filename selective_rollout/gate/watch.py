"""When to ask a gate about a live group: the one schedule every runner of groups shares.

The coordinator's groups (``rollout.group.GroupRun``) and the integrations' groups
(``integrations.live_group.LiveGroup``) both see actions arrive one trajectory at a time, at
each trajectory's own pace. ``GateWatch`` turns that stream into the gate's questions: step s is
asked about as soon as every live trajectory has s actions (ended ones are END-padded), each
step at most once, only where ``gate.should_check(s)`` (``at_k``: s == K; ``from_k``: every
s >= K), and never again once the gate said stop. Writing that schedule once keeps the
trainer's cuts and the inference loop's cuts at the same steps for the same actions.
"""

from __future__ import annotations

from selective_rollout.gate.base import Gate, GroupView, features_at
from selective_rollout.gate.tracker import DivergenceTracker
from selective_rollout.records import GateRecord


class GateWatch:
    """The actions and end flags of G trajectories, the D_K tracker over them, and the gate's verdict.

    ``describe`` adds every divergence feature at the decided step to the recorded decision (what
    ``rollouts.jsonl`` logs); without it the decision carries the gate's own features only, which
    is all a cut needs. ``task_id`` and ``task_type`` reach the gate in every ``GroupView`` (a
    history gate looks the task's, and its type's, earlier groups up by them).
    """

    def __init__(
        self,
        gate: Gate,
        g: int,
        describe: bool = False,
        task_id: str | None = None,
        task_type: str | None = None,
    ) -> None:
        self.gate, self.g, self.task_id, self.task_type = gate, g, task_id, task_type
        self.actions: list[list[str]] = [[] for _ in range(g)]
        self.ended = [False] * g
        # one trajectory has no pairs: nothing to track and nothing to ask
        self.tracker = DivergenceTracker(g) if g >= 2 else None
        self.decision: GateRecord | None = None  # the latest one; the stopping one once fired
        self._describe = describe
        self._asked_through = 0  # every step up to here was considered (asked, or not due)

    @property
    def fired(self) -> bool:
        return self.decision is not None and self.decision.stop

    def act(self, i: int, action: str, ended: bool = False) -> GateRecord | None:
        """Trajectory i took ``action`` (its last one when ``ended``); returns the decision that
        stopped the group if this action made the gate fire, else None."""
        if self.ended[i]:
            raise ValueError(f"trajectory {i} has ended; it takes no more actions")
        self.actions[i].append(action)
        if self.tracker is not None:
            self.tracker.append(i, action)
        if ended:
            self._end(i)
        return self._ask()

    def end(self, i: int) -> GateRecord | None:
        """Trajectory i is over without a further action (e.g. cut); as ``act`` for the return."""
        if self.ended[i]:
            return None
        self._end(i)
        return self._ask()

    def holds(self, i: int) -> bool:
        """Whether trajectory i has reached a step the gate will be asked about and has not been
        yet (``at_k`` schedules only: under ``from_k`` that would be every step after K, the
        paper's lock-step). A runner that waits while this holds never spends a step past a
        decision that stops the group; the wait ends when the slowest live trajectory gets there
        (or ends), or when the gate fires earlier."""
        if self.tracker is None or self.fired or self.ended[i] or self.gate.mode != "at_k":
            return False
        step = len(self.actions[i])
        return step > self._asked_through and self.gate.should_check(step)

    def _end(self, i: int) -> None:
        self.ended[i] = True
        if self.tracker is not None:
            self.tracker.end(i)

    def _ask(self) -> GateRecord | None:
        if self.tracker is None or self.fired:
            return None
        live = [i for i in range(self.g) if not self.ended[i]]
        if not live:
            return None  # the group is over; nothing left to save
        ready = min(len(self.actions[i]) for i in live)
        while self._asked_through < ready:
            self._asked_through += 1
            step = self._asked_through
            if not self.gate.should_check(step):
                continue
            state = GroupView(
                self.actions,
                step=step,
                ended=list(self.ended),
                tracker=self.tracker,
                task_id=self.task_id,
                task_type=self.task_type,
            )
            verdict = self.gate.decide(state)
            features = dict(verdict.features)
            if self._describe:
                features = {**features_at(state), **features}
            self.decision = GateRecord(step=step, stop=verdict.stop, reason=verdict.reason, features=features)
            if verdict.stop:
                return self.decision
        return None
