"""Actors Ray cannot place stop the run after ``placement.pending_timeout_s`` with one line naming
them and what the cluster lacks, instead of a driver that waits forever."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from selective_rollout.config import load_config
from selective_rollout.placement import ActorsPending, pending_error, resource_demand, wait_for_actors

NOBODY_HAS = "no_node_offers_this"


class NeverReady:
    """A ``ray.wait`` double: nothing is ever ready; records the time-outs it was given."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def __call__(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        assert num_returns == len(refs)
        self.timeouts.append(timeout)
        return [], list(refs)


def test_pending_past_the_timeout_is_one_line_naming_actors_and_shortfall(caplog):
    wait = NeverReady()
    refs = {"a": "engine 0", "b": "engine 1", "c": "the coordinator (or its env workers)"}
    with caplog.at_level(logging.WARNING), pytest.raises(ActorsPending) as raised:
        wait_for_actors(
            refs, 150, {"GPU": 16, "CPU": 20}, poll_s=60, wait=wait, cluster=lambda: {"CPU": 64, "GPU": 8}
        )
    assert wait.timeouts == [60, 60, 30]  # polls, then the rest of the time-out: never forever
    message = str(raised.value)
    assert "\n" not in message and isinstance(raised.value, ValueError)  # main() prints it, exits 2
    assert message.startswith("engines 0, 1; the coordinator (or its env workers) still pending after 150 s")
    assert "the cluster lacks GPU: the run asks for 16, the cluster has 8" in message
    assert "placement.pending_timeout_s" in message
    assert len([r for r in caplog.records if "not started after" in r.getMessage()]) == 2


def test_actors_that_start_before_the_timeout_pass():
    calls: list[float] = []

    def second_poll_ready(refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        calls.append(timeout)
        return (list(refs), []) if len(calls) == 2 else ([], list(refs))

    wait_for_actors({"a": "engine 0"}, 600, {"GPU": 1}, wait=second_poll_ready, cluster=dict)
    assert calls == [60, 60]


def test_only_the_time_without_a_node_counts_against_the_timeout():
    """An actor placed after the first poll but loading for five more polls (a 7B model's load and
    compile) is waited for past the time-out: only the first poll counted."""
    calls: list[float] = []

    def ready_on_sixth_poll(refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        calls.append(timeout)
        return (list(refs), []) if len(calls) == 6 else ([], list(refs))

    def placed_after_first_poll(refs: list) -> list:
        return list(refs) if not calls else []

    wait_for_actors(
        {"a": "engine 0"},
        90,
        {"GPU": 1},
        wait=ready_on_sixth_poll,
        cluster=dict,
        unplaced=placed_after_first_poll,
    )
    assert calls == [60, 60, 60, 60, 60, 60]


def test_enough_in_total_says_something_else_holds_it():
    message = pending_error(["engine 3"], 600, {"GPU": 4}, {"GPU": 8, "CPU": 16})
    assert message.startswith("engine 3 still pending after 600 s: the cluster has what the run asks")
    assert "other actors or jobs hold it" in message and "ray status" in message


def test_the_timeout_is_a_placement_key():
    assert load_config(None).placement.pending_timeout_s == 600
    assert load_config(None, ["placement.pending_timeout_s=30"]).placement.pending_timeout_s == 30


class Unplaceable:
    """Asks for a custom resource no node offers: Ray keeps it pending forever."""

    def location(self) -> dict:
        return {}

    def placement(self) -> dict:
        return {}


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_an_actor_ray_cannot_place_stops_the_wait(ray_cluster):
    import ray

    actor = ray.remote(Unplaceable).options(num_cpus=0, resources={NOBODY_HAS: 1}).remote()
    try:
        pending = rf"engine 0 still pending after 2 s: .*{NOBODY_HAS}: the run asks for 1"
        with pytest.raises(ActorsPending, match=pending):
            wait_for_actors({actor.location.remote(): "engine 0"}, 2, {NOBODY_HAS: 1}, poll_s=1)
    finally:
        ray.kill(actor)


class SlowStart:
    """Placed at once, then a long ``__init__``: a model's load, not a placement problem."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    def location(self) -> dict:
        return {}


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_an_actor_placed_but_still_loading_is_not_pending(ray_cluster):
    import ray

    actor = ray.remote(SlowStart).options(num_cpus=0).remote(6.0)
    try:
        wait_for_actors({actor.location.remote(): "engine 0"}, 2, {}, poll_s=1)
    finally:
        ray.kill(actor)


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_record_placement_stops_the_run_when_engines_stay_pending(ray_cluster, tmp_path: Path):
    """The driver's own path: ``RunActors.record_placement`` over an engine no node can host."""
    import ray

    from selective_rollout.driver import RunActors

    cfg = load_config(
        None, ["placement.pending_timeout_s=2", f"placement.engine_resources={{{NOBODY_HAS}: 1}}"]
    )
    driver = RunActors.__new__(RunActors)  # only what record_placement reads: no model, no learners
    driver.cfg, driver.run_dir = cfg, tmp_path
    unplaceable = ray.remote(Unplaceable).options(num_cpus=0, resources={NOBODY_HAS: 1})
    driver.engines = [unplaceable.remote()]
    driver.coordinator = ray.remote(Unplaceable).options(num_cpus=0).remote()
    assert resource_demand(cfg)[NOBODY_HAS] == 1
    try:
        with pytest.raises(ActorsPending) as raised:
            driver.record_placement()
        message = str(raised.value)
        assert message.startswith("engine 0 still pending after 2 s: the cluster lacks "), message
        assert f"{NOBODY_HAS}: the run asks for 1, the cluster has 0" in message
        assert not (tmp_path / "placement.json").exists()
    finally:
        for actor in [*driver.engines, driver.coordinator]:
            ray.kill(actor)


def test_learners_ray_cannot_place_stop_the_run_before_their_rendezvous(ray_cluster):
    """The learner group waits for its actors' first answer through the driver's ``wait_started``
    (before it, ``LearnerGroup`` waited on the rendezvous as long as Ray keeps them pending)."""
    from selective_rollout.config.trainer import TrainerConfig
    from selective_rollout.learner import LearnerGroup

    demand = {NOBODY_HAS: 2.0}
    with pytest.raises(ActorsPending, match=rf"^learners 0, 1 still pending after 2 s: .*{NOBODY_HAS}"):
        LearnerGroup(
            TrainerConfig(num_learners=2),
            "/nonexistent-model",
            actor_options={"num_cpus": 0, "resources": {NOBODY_HAS: 1}},
            wait_started=lambda refs: wait_for_actors(refs, 2.0, demand, poll_s=1.0),
        )
