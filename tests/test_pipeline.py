"""The rollout pipeline's schedule (driver.pipeline) over fake rollouts: which version plays each
batch, when the engines are synced, and that a slow learner never pushes staleness past the bound."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from selective_rollout.driver.pipeline import RolloutPipeline
from selective_rollout.rollout.source import RolloutBatch


@dataclass
class FakeRun:
    """Rollouts that consume 3 tasks each; a learner that updates on every batch; a log of events
    in the order the driver would see them."""

    events: list[str] = field(default_factory=list)
    synced: list[int] = field(default_factory=list)  # the policy version each sync sent
    in_flight: int = 0
    most_in_flight: int = 0

    def start(self, iteration: int, cursor: int, version: int) -> tuple[int, int, int]:
        self.events.append(f"start {iteration} v{version} @{cursor}")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return (iteration, cursor, version)

    def wait(self, handle: tuple[int, int, int], iteration: int) -> RolloutBatch:
        assert handle[0] == iteration
        self.in_flight -= 1
        self.events.append(f"done {iteration}")
        return RolloutBatch([], [], {}, tasks_consumed=3)

    def sync(self, version: int) -> float:
        self.events.append("sync")
        self.synced.append(version)
        return 0.5


def run_loop(
    kind: str, bound: int, iterations: int, eval_at: set[int] = frozenset(), in_flight: bool = False
) -> tuple[FakeRun, list]:
    """The driver's use of the pipeline: take, prefetch, train (one update each), maybe evaluate."""
    fake = FakeRun()
    pipe = RolloutPipeline(
        kind, bound, fake.start, fake.wait, fake.sync, version=0, cursor=0, sync_in_flight=in_flight
    )
    trained = []
    for it in range(iterations):
        collected = pipe.take(it)
        if it + 1 < iterations:
            pipe.prefetch(it + 1)
        staleness = pipe.learner_version - collected.version
        trained.append((it, collected.version, staleness))
        fake.events.append(f"train {it}")  # the learner's update, while a prefetched rollout plays
        pipe.updated()
        if it + 1 in eval_at:
            pipe.serve_latest()
            assert pipe.engine_version == pipe.learner_version
            fake.events.append("eval")
    return fake, trained


def test_sync_trains_every_batch_on_the_version_that_played_it():
    fake, trained = run_loop("sync", 1, 4)
    assert [s for _, _, s in trained] == [0, 0, 0, 0]
    assert fake.events[:6] == ["start 0 v0 @0", "done 0", "train 0", "sync", "start 1 v1 @3", "done 1"]
    assert fake.most_in_flight == 1
    assert fake.synced == [1, 2, 3, 4]  # each sync sends the learner's version, which the engines then serve


def test_async_plays_the_next_batch_while_the_learner_trains():
    fake, trained = run_loop("async", 1, 4)
    # the first batch is fresh; every later one was played during the previous update: lag 1
    assert [s for _, _, s in trained] == [0, 1, 1, 1]
    # iteration 1's rollout starts before iteration 0 trains, from the tasks after batch 0's
    assert fake.events[:4] == ["start 0 v0 @0", "done 0", "start 1 v0 @3", "train 0"]
    # a batch's tasks are taken once: the cursors advance by what each batch consumed
    starts = [e for e in fake.events if e.startswith("start")]
    assert [s.split("@")[1] for s in starts] == ["0", "3", "6", "9"]
    assert "start 3 v2 @9" in fake.events


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_a_slow_learner_never_pushes_staleness_past_the_bound(bound):
    """The learner updates on every batch, so the engines would fall behind without syncs: the
    pipeline syncs exactly as often as the bound needs, and no more."""
    fake, trained = run_loop("async", bound, 12)
    lags = [s for _, _, s in trained]
    assert max(lags) == bound and all(0 <= s <= bound for s in lags)
    # one sync per `bound` updates: rollout k starts when k - 1 updates are done, and the engines
    # move to the newest version only when the bound binds (k - engines > bound), at k = b+1, 2b+1...
    assert fake.events.count("sync") == (12 - 2) // bound


def test_sync_in_flight_sends_every_update_at_once_while_the_next_rollout_plays():
    """Each update reaches the engines as soon as it is made, the rollout that started before it
    still in flight: that rollout's group version is the one it started under (lag 1 at training),
    and no rollout ever waits for a sync before it starts."""
    fake, trained = run_loop("async", 3, 6, in_flight=True)
    assert fake.events[:6] == ["start 0 v0 @0", "done 0", "start 1 v0 @3", "train 0", "sync", "done 1"]
    assert [s for _, _, s in trained] == [0, 1, 1, 1, 1, 1]  # within one update, whatever the bound
    assert fake.synced == [1, 2, 3, 4, 5, 6]
    # every start follows the previous batch's collection directly, never a sync
    for i, event in enumerate(fake.events):
        if event.startswith("start") and i:
            assert fake.events[i - 1].startswith("done")


def test_evaluation_waits_for_the_rollout_in_flight_and_scores_the_latest_weights():
    fake, trained = run_loop("async", 1, 4, eval_at={2})
    at = fake.events.index("eval")
    # iteration 2's rollout (started before iteration 1 trained) finished, then the engines synced
    assert fake.events[at - 2 : at] == ["done 2", "sync"]
    # its batch is not played again: one start per iteration, and it is trained at lag 1
    assert sum(e.startswith("start 2") for e in fake.events) == 1
    assert trained[2] == (2, 1, 1)


def test_syncs_are_counted_per_iteration():
    fake = FakeRun()
    pipe = RolloutPipeline("sync", 1, fake.start, fake.wait, fake.sync, version=4, cursor=7)
    collected = pipe.take(0)
    assert collected.version == 4 and pipe.cursor == 10
    assert pipe.take_syncs() == (0, 0.0)
    pipe.updated()
    assert pipe.take_syncs() == (1, 0.5) and pipe.take_syncs() == (0, 0.0)


def test_async_with_the_uncorrected_loss_warns_once_at_load(caplog):
    import logging

    from selective_rollout.config import load_config

    with caplog.at_level(logging.WARNING, logger="selective_rollout.config"):
        load_config(None, ["driver.pipeline=async"])
        load_config(None, ["driver.pipeline=async", "trainer.policy_loss=decoupled_ppo"])
        load_config(None, ["driver.pipeline=sync"])
    warned = [r.message for r in caplog.records if "does not correct" in r.message]
    assert len(warned) == 1 and "trainer.policy_loss=decoupled_ppo" in warned[0]


def test_a_replaced_engine_forces_a_sync_before_the_next_rollout():
    """A replacement loads the learner's latest weights: the engines no longer serve one version,
    so the next rollout starts after a sync even where the bound would allow one more lag."""
    fake = FakeRun()
    pipe = RolloutPipeline("async", 3, fake.start, fake.wait, fake.sync, version=0, cursor=0)
    pipe.take(0)
    pipe.prefetch(1)
    pipe.updated()
    assert "sync" not in fake.events  # within the bound: no sync due
    pipe.take(1)
    pipe.engines_replaced()
    pipe.prefetch(2)
    assert fake.events[-2:] == ["sync", "start 2 v1 @6"]
    pipe.updated()
    pipe.take(2)
    pipe.prefetch(3)
    assert fake.events[-1] == "start 3 v1 @9"  # one sync cleared it: the bound rules again


@pytest.mark.parametrize(
    ("bound", "in_flight", "synced", "versions"),
    [
        (1, False, [1, 2, 3, 4], [0, 0, 1, 2]),
        (2, False, [2, 4], [0, 0, 0, 2]),
        (2, True, [1, 2, 3, 4], [0, 0, 1, 2]),
    ],
)
def test_a_stream_sends_updates_while_groups_play_as_often_as_its_bound_needs(
    bound, in_flight, synced, versions
):
    """The stream never pauses for weights: an update is sent once the engines lag the learner by
    the bound (every update at bound 1, every other at 2), or every update with sync_in_flight.
    The fake stream plays under the weights last synced: each batch holds a group played before
    the previous take and one played just now, and trains at the older one's version."""
    from selective_rollout.records import GroupRecord, Outcome

    fake, asked, served = FakeRun(), [], [0]  # served: the engines' version at each take

    def take(iteration: int, learner_version: int) -> RolloutBatch:
        asked.append((iteration, learner_version))
        served.append(fake.synced[-1] if fake.synced else 0)
        groups = []
        for g, version in enumerate(served[-2:]):
            group = GroupRecord(f"it{iteration}-g{g}", "t", "x", [], Outcome.COMPLETED, iteration)
            group.policy_version = version
            groups.append(group)
        return RolloutBatch([], groups, {}, 0, stream_indices=[iteration])

    pipe = RolloutPipeline(
        "stream",
        bound,
        fake.start,
        fake.wait,
        fake.sync,
        version=0,
        cursor=0,
        sync_in_flight=in_flight,
        take_stream=take,
    )
    taken = []
    for it in range(4):
        collected = pipe.take(it)
        taken.append(collected.version)  # the oldest trained group's
        assert pipe.learner_version - collected.version <= bound
        pipe.prefetch(it + 1)  # nothing to prefetch: the stream plays on by itself
        pipe.updated()
    assert taken == versions
    assert asked == [(0, 0), (1, 1), (2, 2), (3, 3)]  # each take says the version it trains at
    assert fake.synced == synced and not any(e.startswith("start") for e in fake.events)
    pipe.engines_replaced()  # a replaced engine: the stream syncs at once, not at a next rollout
    assert fake.synced[-1] == 4 and pipe.engine_version == 4


def test_a_stream_pipeline_needs_its_take():
    with pytest.raises(ValueError, match="take_stream"):
        RolloutPipeline("stream", 1, FakeRun().start, FakeRun().wait, FakeRun().sync, version=0, cursor=0)
