"""LiveGroup: when the gate is asked, whom it cuts, and that a cut cancels pending work."""

from __future__ import annotations

import asyncio

import pytest

from selective_rollout.gate import build_gate
from selective_rollout.integrations.live_group import LiveGroup
from selective_rollout.lifecycle import GroupPhase
from selective_rollout.records import Outcome


def test_gate_is_asked_only_once_every_live_sample_reached_k() -> None:
    group = LiveGroup(build_gate("prefix_edit", k=2, tau=0.5), g=3)
    for i in range(3):
        group.record(i, "go to sink 1")
    group.record(0, "look")
    group.record(1, "look")
    assert not group.fired  # sample 2 has one action: D_2 is not defined yet
    group.record(2, "look")
    assert group.fired and group.cut_step == 2 and group.cut == [True, True, True]
    # the coordinator's lifecycle: a stop acted on at once, never audited, never trained on
    assert group.life.trail == [GroupPhase.RUNNING, GroupPhase.AT_GATE, GroupPhase.CUT]
    assert group.life.settle([0.0, 1.0, 0.0], keep=lambda zero: True).outcome is Outcome.CUT


def test_ended_samples_are_padded_and_diverse_groups_run_on() -> None:
    group = LiveGroup(build_gate("prefix_edit", k=2, tau=0.12), g=2)
    group.record(0, "go to sink 1")
    group.end(0)
    group.record(1, "go to fridge 1")
    group.record(1, "open fridge 1")
    assert not group.fired and group.cut == [False, False]
    assert group.life.phase is GroupPhase.RUNNING
    group.end(1)
    assert group.life.phase is GroupPhase.FINISHED and not group.fired


def test_inference_keeps_survivors() -> None:
    group = LiveGroup(build_gate("prefix_edit", k=1, tau=0.6), g=4, survivors=1)
    group.end(0)
    for i in range(1, 4):
        group.record(i, "look")
    assert group.cut == [False, False, True, True]  # sample 0 had ended: the first live one survives


def test_from_k_asks_at_every_step() -> None:
    group = LiveGroup(build_gate("prefix_edit", k=1, tau=0.4, mode="from_k"), g=2)
    group.record(0, "a")
    group.record(1, "b")
    assert not group.fired
    group.record(0, "c")
    group.record(1, "c")
    assert not group.fired  # D_2 = 1/2
    group.record(0, "c")
    group.record(1, "c")
    assert group.fired and group.cut_step == 3  # D_3 = 1/3 < 0.4


def test_bad_sizes_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="G >= 2"):
        LiveGroup(build_gate("none"), g=1)
    with pytest.raises(ValueError, match="survivors"):
        LiveGroup(build_gate("none"), g=2, survivors=2)


def test_cut_cancels_pending_work_and_finished_work_is_returned() -> None:
    async def main() -> tuple[object, object, bool]:
        group = LiveGroup(build_gate("prefix_edit", k=1, tau=0.5), g=2)
        cancelled = asyncio.Event()

        async def slow() -> str:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "late"

        async def fast() -> str:
            return "done"

        pending = asyncio.ensure_future(group.unless_cut(0, slow()))
        quick = await group.unless_cut(1, fast())
        await asyncio.sleep(0)
        group.record(0, "look")
        group.record(1, "look")
        return await pending, quick, cancelled.is_set()

    late, quick, cancelled = asyncio.run(main())
    assert late is None and cancelled and quick == "done"
