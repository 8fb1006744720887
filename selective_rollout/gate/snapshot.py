"""A logged group as a gate would have seen it at a step, computed once per group.

The held-out calibration and the offline replay ask a gate about the same logged groups hundreds
of times, and the gates with memory (``history``, ``precision_target``) read finished groups'
whole D_k as they observe them online: both go through these helpers, so a state, a distance or
a token sum is derived from a record in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from selective_rollout.gate.base import GroupView
from selective_rollout.gate.distance import prefix_edit_distance
from selective_rollout.records import GroupRecord

T = TypeVar("T")

# Calibration replays the same groups hundreds of times; inside ``caching()`` what a replay
# derives from a logged group (its states at each step, D_k, token sums) is computed once. The
# key is the group's trajectory list, which the records a replay hands its gate share; the
# cache holds it, so its id is not reused while cached. Off by default (online, a gate's
# observed groups must not pile up here).
_MEMO: dict[int, tuple[object, dict]] | None = None


@contextmanager
def caching() -> Iterator[None]:
    global _MEMO
    outer, _MEMO = _MEMO, ({} if _MEMO is None else _MEMO)
    try:
        yield
    finally:
        _MEMO = outer


def memo(record: GroupRecord, key: tuple, compute: Callable[[], T]) -> T:
    if _MEMO is None:
        return compute()
    owner = record.trajectories
    entry = _MEMO.get(id(owner))
    if entry is None or entry[0] is not owner:
        entry = _MEMO[id(owner)] = (owner, {})
    if key not in entry[1]:
        entry[1][key] = compute()
    return entry[1][key]  # type: ignore[return-value]


def labelled(groups: Iterable[GroupRecord]) -> list[GroupRecord]:
    """The groups a gate can be scored on, in log order: final rewards known and G >= 2."""
    return [g for g in groups if g.has_final_rewards and g.g >= 2]


def live_after(record: GroupRecord, step: int) -> bool:
    """Whether a trajectory was still running after ``step`` actions (else the gate is not asked)."""
    return any(len(t.steps) > step for t in record.trajectories)


def state_at(record: GroupRecord, step: int, with_rewards: bool = False) -> GroupView:
    """The group as a run's gate sees it once every live trajectory has ``step`` actions: the
    first ``step`` actions each, a trajectory whose log ends by then marked ended."""
    return memo(record, ("state", step, with_rewards), lambda: _state_at(record, step, with_rewards))


def _state_at(record: GroupRecord, step: int, with_rewards: bool) -> GroupView:
    return GroupView(
        [t.actions[:step] for t in record.trajectories],
        step=step,
        ended=[len(t.steps) <= step for t in record.trajectories],
        final_rewards=[float(t.reward) for t in record.trajectories] if with_rewards else None,  # type: ignore[arg-type]
        task_id=record.task_id,
        task_type=record.task_type or None,
    )


def whole_distance(record: GroupRecord, k: int) -> float:
    """D_k of a finished group's whole trajectories (those shorter than k are END-padded)."""
    actions = [t.actions for t in record.trajectories]
    return memo(record, ("whole", k), lambda: prefix_edit_distance(actions, k, [True] * record.g))


def tokens_after(record: GroupRecord, after: int = 0) -> int:
    """Step-tokens the group spent after ``after`` actions (all of them at 0)."""
    return memo(record, ("tokens", after), lambda: record.tokens_after(after))
