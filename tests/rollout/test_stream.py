"""The continuous stream of groups (``driver.pipeline=stream``) with the scripted doubles of the
coordinator's unit tests: batches fill in the order groups settle, the staleness bound stops
admission under a slow learner (counting the room a batch's cap leaves), a group that settles
late beyond the bound is dropped as STALE, a failed task is played again once across takes, and
a resumed stream passes over the tasks already settled.

Engines hold a game's replies on an event the test sets, so every order asserted here is made
certain, not timed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from selective_rollout.config import load_config
from selective_rollout.envs.base import folder_task
from selective_rollout.records import Outcome, read_groups
from selective_rollout.rollout.coordinator import rollout_source
from selective_rollout.rollout.stream import GroupStream, StreamStart, advance
from tests.rollout.test_coordinator_unit import GAMES, SCRIPTS, ScriptedAgent, ScriptedEngine, ScriptedEnv


@dataclass
class HeldEngine(ScriptedEngine):
    """A scripted engine whose replies for a held game wait until the test releases it."""

    held: dict[str, asyncio.Event] = field(default_factory=dict)

    async def _generate(self, request_id, prompt, sampling, session_id=None):
        hold = self.held.get(GAMES[prompt[0]])
        if hold is not None:
            await hold.wait()
        return await super()._generate(request_id, prompt, sampling, session_id)


def _stream(tmp_path, games, overrides=(), cursor=0, settled=(), last=9, max_staleness=1, held=()):
    """A stream over ``games`` (the task list, repeated) played by the scripted doubles."""
    cfg = load_config(
        None,
        ["rollout.group_size=2", "rollout.strategy=none", "rollout.groups_per_iteration=1", *overrides],
    )
    engine = HeldEngine(SCRIPTS, delay=0.001, held={g: asyncio.Event() for g in held})
    source = rollout_source(cfg, [engine], ScriptedEnv(), ScriptedAgent(), tmp_path)
    tasks = [folder_task(g, g, "pick_and_place_simple") for g in games]

    def endless():
        position = 0
        while True:
            if position >= cursor:
                yield tasks[position % len(tasks)]
            position += 1

    start = StreamStart(tasks, 0, cursor, list(settled), 0, last, 0, max_staleness)
    stream = GroupStream(source, endless(), start)
    return stream, source, engine


async def _until(condition, what):
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_batches_fill_as_groups_settle_and_are_logged_when_taken(tmp_path):
    async def main():
        games = ["diverge_mixed", "early_win", "converge_win"]
        stream, source, _ = _stream(tmp_path, games, ["rollout.groups_per_iteration=2"])
        log = tmp_path / "rollouts.jsonl"
        await _until(lambda: stream._batches[0].complete, "batch 0 complete")
        assert not log.exists() or not list(read_groups(log))  # settled, not yet taken: not logged
        first = await stream.take(0, learner_version=0)
        assert len(first.kept_group_ids) == 2 and len(first.experiences) == 4
        assert len(first.stream_indices) == 2
        assert [g.group_id for g in read_groups(log)] == [r.group_id for r in first.groups]
        second = await stream.take(1, learner_version=1)
        assert len(second.kept_group_ids) == 2
        assert not set(first.stream_indices) & set(second.stream_indices)
        assert first.metrics["rollout/groups_trained"] == 2 and second.metrics["rollout/groups_stale"] == 0
        await stream.close()
        source.close()

    asyncio.run(main())


def test_a_slow_learner_stops_new_groups_at_the_bound_until_newer_weights_arrive(tmp_path):
    """One trainable group per batch, staleness bound 1, the engines at version 0: batch 0 trains
    at version 0 and batch 1 at version 1, so exactly two groups may start before the learner
    moves; a take alone does not move the engines' weights, a weight update does."""

    async def main():
        stream, source, _ = _stream(tmp_path, ["diverge_mixed"], ["rollout.max_groups_in_flight=8"])
        await _until(lambda: stream._batches.get(1) is not None and stream._batches[1].complete, "batch 1")
        await asyncio.sleep(0.2)  # the player has run: nothing else may have started
        assert source._group_seq == 2 and not stream._running
        await stream.take(0, learner_version=0)
        await asyncio.sleep(0.2)
        assert source._group_seq == 2 and not stream._running  # batch 2 would train at version 2
        source.version = 1  # the learner's update reached the engines
        stream.weights_updated()
        await _until(lambda: stream._batches.get(2) is not None and stream._batches[2].complete, "batch 2")
        second = await stream.take(1, learner_version=1)
        third = await stream.take(2, learner_version=2)
        assert [r.policy_version for r in second.groups] == [0]  # lag 1
        assert [r.policy_version for r in third.groups] == [1]  # lag 1
        await stream.close()
        source.close()

    asyncio.run(main())


def test_a_group_that_settles_beyond_the_bound_is_dropped_as_stale_and_counted(tmp_path):
    """The held group starts first at version 0; the groups after it fill batches 0 and 1; it
    settles into batch 2, which trains at version 2: lag 2 > 1, so it is STALE, logged, counted
    and never trained, and batch 2 is filled by a fresh group."""

    async def main():
        games = ["early_win", "diverge_mixed", "diverge_mixed", "diverge_mixed", "diverge_mixed"]
        stream, source, engine = _stream(
            tmp_path, games, ["rollout.max_groups_in_flight=8"], held=["early_win"]
        )
        first = await stream.take(0, learner_version=0)
        assert [r.task_id for r in first.groups] == ["diverge_mixed"]
        source.version = 1
        stream.weights_updated()
        second = await stream.take(1, learner_version=1)
        assert [(r.task_id, r.policy_version) for r in second.groups] == [("diverge_mixed", 1)]
        engine.held["early_win"].set()
        third = await stream.take(2, learner_version=2)
        outcomes = [(r.task_id, r.outcome, r.policy_version) for r in third.groups]
        assert outcomes[0] == ("early_win", Outcome.STALE, 0)
        assert outcomes[1:] == [("diverge_mixed", Outcome.COMPLETED, 1)]
        assert third.metrics["rollout/groups_stale"] == 1 and third.metrics["rollout/groups_trained"] == 1
        assert {e.group_id for e in third.experiences} == {third.groups[1].group_id}
        logged = {g.group_id: g.outcome for g in read_groups(tmp_path / "rollouts.jsonl")}
        assert logged[third.groups[0].group_id] is Outcome.STALE
        assert not third.groups[0].trained_on and third.groups[0].zero_variance is not None  # rewards kept
        await stream.close()
        source.close()

    asyncio.run(main())


def test_a_resumed_stream_passes_over_the_settled_tasks():
    assert advance(0, [], [0, 1, 3]) == (2, [3])
    assert advance(2, [3], [2]) == (4, [])
    assert advance(4, [], [6, 5]) == (4, [5, 6])


def test_a_stream_resumed_at_a_cursor_plays_the_unsettled_tasks_only(tmp_path):
    async def main():
        games = ["diverge_mixed", "early_win", "converge_win", "diverge_lose", "early_win"]
        stream, source, _ = _stream(
            tmp_path, games, ["rollout.max_groups_in_flight=1"], cursor=1, settled=[2], max_staleness=9
        )
        taken = [await stream.take(i, learner_version=i) for i in range(3)]
        indices = sorted(i for b in taken for i in b.stream_indices)
        assert indices == [1, 3, 4]
        assert sorted(r.task_id for b in taken for r in b.groups) == [
            "diverge_lose",
            "early_win",
            "early_win",
        ]
        await stream.close()
        source.close()

    asyncio.run(main())


def test_a_take_waiting_on_a_stream_whose_player_died_raises_its_error_at_once(tmp_path):
    """The player failing outside a group (here the strategy's refusal raising for the second
    task) ends the stream: the take waiting for its batch raises the player's error instead of
    waiting for groups that will never be started."""

    async def main():
        stream, source, _ = _stream(
            tmp_path, ["early_win", "diverge_mixed"], ["rollout.max_groups_in_flight=8"], held=["early_win"]
        )
        refusal = source.refusal

        def refuse_second(task, iteration):
            if task.task_id == "diverge_mixed":
                raise ValueError("the strategy's state is corrupt")
            return refusal(task, iteration)

        source.refusal = refuse_second
        try:
            await asyncio.wait_for(stream.take(0, learner_version=0), timeout=30)
        except RuntimeError as exc:
            assert "stopped before batch 0 was complete" in str(exc)
            assert isinstance(exc.__cause__, ValueError)
        else:
            raise AssertionError("the take returned a batch the stream never completed")
        await stream.close()
        source.close()

    asyncio.run(main())


def test_closing_a_stream_aborts_the_requests_of_its_groups_in_flight(tmp_path):
    """A stream closed after its last take cancels the groups still playing; their requests are
    aborted on the engine too (a Ray call is not cancelled with its caller), so none decodes on
    beside the final evaluation, and no trajectory loop is left running."""

    async def main():
        stream, source, engine = _stream(tmp_path, ["early_win"], held=["early_win"])
        await _until(lambda: len(stream._running) == 2, "both groups the bound allows started")
        await asyncio.sleep(0.1)  # its two trajectories are waiting on the engine
        before = set(asyncio.all_tasks())
        await stream.close()
        # bound 1: two groups of two trajectories were playing; each request aborted once
        assert sorted(engine.aborted) == [f"it0-g{g}-t{t}-s0" for g in (1, 2) for t in (0, 1)]
        await asyncio.sleep(0.05)
        left = {t for t in asyncio.all_tasks() - {asyncio.current_task()} if t in before and not t.done()}
        assert not left, f"tasks still running after close: {left}"
        source.close()

    asyncio.run(main())


def test_admission_counts_the_room_a_batch_has_left_under_its_cap(tmp_path):
    """Two trainable groups per batch, a cap of three started, bound 1, the engines at version 0:
    batches 0 and 1 may be played. Two groups of batch 0 are filtered (all lose) while two held
    ones play on, so batch 0 has room for one more group, not two: of the held ones, one closes
    batch 0 and one joins batch 1, so only one more group may start. Were the room counted as two,
    a fourth held group would start, land in batch 2 (trained at version 2) and be dropped as stale."""

    async def main():
        games = ["converge_lose", "converge_lose", *["diverge_mixed"] * 4]
        overrides = [
            "rollout.strategy=dapo",
            "rollout.groups_per_iteration=2",
            "rollout.max_groups_factor=1.5",
            "rollout.max_groups_in_flight=8",
        ]
        stream, source, engine = _stream(tmp_path, games, overrides, held=["diverge_mixed"])
        await _until(lambda: len(stream._batches[0].records) == 2, "the two filtered groups settled")
        await asyncio.sleep(0.2)  # the player has run: nothing else may have started
        assert [r.outcome for r in stream._batches[0].records] == [Outcome.FILTERED] * 2
        assert source._group_seq == 5 and len(stream._running) == 3
        engine.held["diverge_mixed"].set()
        first = await stream.take(0, learner_version=0)
        second = await stream.take(1, learner_version=1)
        assert len(first.kept_group_ids) == 1 and len(second.kept_group_ids) == 2
        assert all(r.outcome is not Outcome.STALE for r in [*first.groups, *second.groups])
        await stream.close()
        source.close()

    asyncio.run(main())


@dataclass
class FailingGameEngine(HeldEngine):
    """Fails every request of one game (Ray's RayTaskError; the engine lives): a group's first
    try at once, every later try only once the test releases it."""

    failing: str = "converge_win"
    retries_fail: asyncio.Event = field(default_factory=asyncio.Event)
    tries: set[str] = field(default_factory=set)

    async def _generate(self, request_id, prompt, sampling, session_id=None):
        from ray.exceptions import RayTaskError

        if GAMES[prompt[0]] != self.failing:
            return await super()._generate(request_id, prompt, sampling, session_id)
        group = request_id.split("-")[1]
        self.tries.add(group)
        if len(self.tries) > 1 and group != min(self.tries, key=lambda g: int(g[1:])):
            await self.retries_fail.wait()
        raise RayTaskError("generate", "tb", ValueError(f"cannot serve {request_id}"))


def test_a_failed_task_is_played_again_once_even_when_its_tries_straddle_a_take(tmp_path):
    """The task's first try fails into batch 0 and its retry is still playing when batch 0 is
    taken; the retry fails too, into batch 1, and the task is not played a third time."""

    async def main():
        games = ["converge_win", "diverge_mixed"]
        cfg = load_config(
            None,
            [
                "rollout.group_size=2",
                "rollout.strategy=none",
                "rollout.groups_per_iteration=1",
                "rollout.max_groups_in_flight=2",
            ],
        )
        engine = FailingGameEngine(SCRIPTS, delay=0.001, held={"diverge_mixed": asyncio.Event()})
        source = rollout_source(cfg, [engine], ScriptedEnv(), ScriptedAgent(), tmp_path)
        tasks = [folder_task(g, g, "pick_and_place_simple") for g in games]
        endless = iter([tasks[0], *[tasks[1]] * 100])  # the failing task once
        stream = GroupStream(source, endless, StreamStart(tasks, 0, 0, [], 0, 9, 0, 9))
        await _until(lambda: len(engine.tries) == 2, "the first try failed and the retry plays, held")
        engine.held["diverge_mixed"].set()  # now batch 0 can complete
        first = await stream.take(0, learner_version=0)
        assert (first.groups[0].task_id, first.groups[0].outcome) == ("converge_win", Outcome.FAILED)
        assert len(engine.tries) == 2 and stream._running  # the retry still plays, held
        engine.retries_fail.set()
        later = [await stream.take(i, learner_version=i) for i in (1, 2, 3)]
        played = [r for b in (first, *later) for r in b.groups if r.task_id == "converge_win"]
        assert [r.outcome for r in played] == [Outcome.FAILED, Outcome.FAILED]
        assert {r.meta["stream_index"] for r in played} == {0} and len(engine.tries) == 2
        await stream.close()
        source.close()

    asyncio.run(main())
