"""The actors of one run as a set: start them, record where they run, sync the learner's
weights to the engines and prove they are served, replace an engine that died, read their health
and memory, close them.

The loop (``driver.loop``) decides when each happens; this class knows how, so a pipeline that
overlaps rollouts and updates can reuse it unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Any

from selective_rollout.config import RunConfig

log = logging.getLogger(__name__)


def unshared_run_dir_error(run_dir: Path, seen: dict[str, bool]) -> str | None:
    """The one-line error when some actor cannot see the driver's run folder (else None)."""
    blind = [name for name, ok in seen.items() if not ok]
    if not blind:
        return None
    return (
        f"the run folder {run_dir.resolve()} is not visible to the {', '.join(blind)} (on other "
        "node(s)): put driver.runs_dir (or driver.run_dir) on a filesystem every node mounts "
        "(docs/cluster.md), or checkpoints and rollouts.jsonl split across nodes"
    )


def check_resources(cfg: RunConfig, joined: bool) -> None:
    """Fail in seconds, with the numbers, when the cluster can never place the run's actors
    (Ray would wait for them forever). On a joined cluster an autoscaler may still add nodes,
    so there it is a warning."""
    import ray

    from selective_rollout.placement import resource_demand, resource_shortfall

    short = resource_shortfall(resource_demand(cfg), ray.cluster_resources())
    if not short:
        return
    message = "the cluster cannot place this run's actors: " + "; ".join(short)
    if not joined:
        raise ValueError(message + " (the placement, engine, trainer and env sections ask for them)")
    log.warning(
        "%s; waiting in case an autoscaler adds nodes (actors still pending after "
        "placement.pending_timeout_s=%g s stop the run)",
        message,
        cfg.placement.pending_timeout_s,
    )


def _dead(engines: list[Any], timeout_s: float = 60.0) -> set[int]:
    """Indices of engine actors that are gone: every health call at once; a dead actor's fails
    at once, a busy one's may take its time (it is not dead)."""
    import ray
    from ray.exceptions import RayActorError

    refs = [engine.health.remote() for engine in engines]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    dead = set()
    for index, ref in enumerate(refs):
        if ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                dead.add(index)
    return dead


class EngineCapabilityError(ValueError):
    """The engines' back-end lacks a capability the run needs; the message names it."""


class RunActors:
    """The engines, the learner group and the coordinator of one run."""

    def __init__(
        self, cfg: RunConfig, run_dir: Path, model_path: Path, actor_model: str, local_ray: bool
    ) -> None:
        """``model_path``: the policy on this node (the probe's tokenizer); ``actor_model``: the
        handle the actors load it by; ``local_ray``: Ray was started here (placement's ``auto``
        allocators)."""
        from selective_rollout.learner import LearnerGroup
        from selective_rollout.placement import resource_demand, wait_for_actors
        from selective_rollout.rollout.coordinator import create_coordinator
        from selective_rollout.rollout.engines import create_engines

        self.cfg, self.run_dir = cfg, run_dir
        self.weights_version = 0  # the policy version the engines serve (a replacement gets it too)
        self.model_path, self.actor_model, self.local_ray = model_path, actor_model, local_ray
        place = cfg.placement
        self.engines = create_engines(
            cfg.engine, actor_model, cfg.engine.num_engines, place.engine_options(local_ray)
        )
        self.learner = LearnerGroup(
            cfg.trainer,
            actor_model,
            seed=cfg.seed,
            actor_options=place.learner_options(local_ray),
            wait_started=lambda refs: wait_for_actors(refs, place.pending_timeout_s, resource_demand(cfg)),
        )
        self.coordinator = create_coordinator(
            cfg,
            self.engines,
            actor_model,
            run_dir,
            place.coordinator_options(local_ray),
            place.env_worker_options(),
        )
        self.engine_restarts = 0
        self.served_gap = 0.0  # the last sync's largest probe gap (system/served_logprob_gap)
        self.record_placement()
        self.check_capabilities()
        self.check_run_dir_is_shared()

    def check_capabilities(self) -> None:
        """Stop with one line when the engines' back-end lacks what training relies on (weight
        sync, the served-weights probe): asked of a running engine, once placed, since the
        back-end's library may be missing from the driver's own environment."""
        import ray

        from selective_rollout.rollout.engines.base import TRAINING_NEEDS, missing_capabilities

        have = ray.get(self.engines[0].capabilities.remote())
        problem = missing_capabilities(have, TRAINING_NEEDS, self.cfg.engine.backend, "a training run")
        if problem is not None:
            raise EngineCapabilityError(problem)

    def replace_dead_engines(self, probe: bool = False) -> None:
        """Start a fresh engine for each one that died, load the current weights into it (the
        sync group is rebuilt by the next ``sync_weights``), and hand it to the coordinator,
        which retries the dead engine's groups once on live engines or waits for this.

        The coordinator notices a death when a request fails; ``probe`` also pings every engine,
        so one that died while idle (before a weight sync) is found too."""
        import ray

        from selective_rollout.rollout.engines import create_engines

        dead = set(ray.get(self.coordinator.dead_engines.remote(), timeout=60))
        if probe:
            dead |= _dead(self.engines)
        for index in sorted(dead):
            with contextlib.suppress(Exception):  # it is dead already; make sure it stays so
                ray.kill(self.engines[index], no_restart=True)
            (engine,) = create_engines(
                self.cfg.engine, self.actor_model, 1, self.cfg.placement.engine_options(self.local_ray)
            )
            self.learner.sync_weights([engine], self.weights_version)
            self.verify_served_weights({f"engine {index}": engine})
            self.engines[index] = engine
            ray.get(self.coordinator.replace_engine.remote(index, engine), timeout=60)
            self.engine_restarts += 1
            log.warning("engine %d died; replaced by a fresh engine with the current weights", index)

    def sync_weights(self, version: int, attempts: int = 3) -> float:
        """Send the learner's weights, policy version ``version``, to every engine; returns the
        seconds the successful sync took.

        An engine that dies during the sync makes it fail within about a second
        (``WeightSyncFailed``, instead of the collective's 300 s timeout): it is replaced like any
        dead engine and the sync re-run on the rebuilt group, which also completes the weights of
        the engines that were receiving, up to ``attempts`` syncs in all."""
        from selective_rollout.learner import WeightSyncFailed

        for attempt in range(1, attempts + 1):
            try:
                self.weights_version = version
                seconds = self.learner.sync_weights(self.engines, version)
                self.verify_served_weights({f"engine {i}": e for i, e in enumerate(self.engines)})
                return seconds
            except WeightSyncFailed as exc:
                if not exc.dead_engines or attempt == attempts:
                    raise
                log.warning(
                    "weight sync %d of %d failed; replacing the dead engines: %s", attempt, attempts, exc
                )
                self.replace_dead_engines(probe=True)
        raise AssertionError("unreachable")

    @functools.cached_property
    def probe_ids(self) -> list[int]:
        """The fixed probe every weight sync is verified on, in the policy's tokens."""
        from transformers import AutoTokenizer

        from selective_rollout.weight_sync.served import PROBE_TEXT

        return list(AutoTokenizer.from_pretrained(str(self.model_path))(PROBE_TEXT)["input_ids"])

    def verify_served_weights(self, engines: dict[str, Any]) -> float:
        """Score the probe on the learner and on each engine (label -> actor); raise
        ``ServedWeightsMismatch`` when one serves other weights (``weight_sync.served``), else
        return the largest gap, logged as ``system/served_logprob_gap``."""
        import ray

        from selective_rollout.weight_sync.served import check_served

        want = self.learner.logprobs([self.probe_ids])[0]
        got = ray.get([e.score.remote(self.probe_ids) for e in engines.values()], timeout=600)
        gaps = check_served(want, dict(zip(engines, got, strict=True)), self.cfg.trainer.served_weights_tol)
        self.served_gap = max(gaps.values())
        log.info("weights served as sent: largest probe log-prob gap %.2g nats", self.served_gap)
        return self.served_gap

    def record_placement(self) -> None:
        """Write placement.json and log how many nodes each kind of actor landed on; stop the run
        with one line when some are still pending after ``placement.pending_timeout_s`` (Ray
        would keep them pending forever)."""
        import ray

        from selective_rollout.placement import (
            nodes_by_kind,
            resource_demand,
            wait_for_actors,
            write_placement,
        )

        engines = [e.location.remote() for e in self.engines]
        coordinator = self.coordinator.placement.remote()
        names = {ref: f"engine {i}" for i, ref in enumerate(engines)}
        names[coordinator] = "the coordinator (or its env workers)"
        wait_for_actors(names, self.cfg.placement.pending_timeout_s, resource_demand(self.cfg))
        placement = {
            "engines": ray.get(engines),
            "learners": self.learner.locations(),
            **ray.get(coordinator),
        }
        write_placement(self.run_dir, placement)
        for kind, nodes in nodes_by_kind(placement).items():
            log.info("placement: %d %s on %d node(s): %s", sum(nodes.values()), kind, len(nodes), nodes)

    def check_run_dir_is_shared(self) -> None:
        """The coordinator writes rollouts.jsonl and the learners the checkpoints into the run folder,
        and the driver reads both: on a cluster it must be one shared filesystem, or a run's
        record splits across nodes and a resume finds half of it. One marker file tells."""
        import ray

        marker = self.run_dir / f".shared-check-{os.getpid()}"
        marker.write_text("written by the driver; read by the run's actors\n")
        try:
            seen = {f"learner {i}": ok for i, ok in enumerate(self.learner.sees(marker))}
            seen["coordinator"] = ray.get(self.coordinator.sees.remote(str(marker)))
        finally:
            marker.unlink(missing_ok=True)
        if error := unshared_run_dir_error(self.run_dir, seen):
            raise RuntimeError(error)

    def engine_healths(self) -> dict[str, dict[str, Any]]:
        """Each live engine's ``health()`` now, keyed by its actor id (a replacement is a new
        key). An engine that does not answer (it died since the last probe, and the next one
        replaces it) is left out, not waited for: its counters are read again from its
        replacement, from zero."""
        import ray
        from ray.exceptions import RayError

        refs = {e._actor_id.hex(): e.health.remote() for e in self.engines}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=60)
        healths: dict[str, dict[str, Any]] = {}
        for key, ref in refs.items():
            if ref in ready:
                with contextlib.suppress(RayError):
                    healths[key] = ray.get(ref)
        return healths

    def memory_metrics(self) -> dict[str, float]:
        """Resident memory of the driver and of every actor of the run, GB: growth across
        iterations shows here long before Ray's memory monitor kills a worker. An actor that does
        not answer (it died since the last probe) is left out, not waited for."""
        import ray
        from ray.exceptions import RayError

        from selective_rollout.process_memory import resident_gb

        named = {f"engine_{i}": e.resident_gb.remote() for i, e in enumerate(self.engines)}
        named["coordinator"] = self.coordinator.resident_gb.remote()
        learners = self.learner.resident_gb()
        ready, _ = ray.wait(list(named.values()), num_returns=len(named), timeout=60)
        metrics: dict[str, float] = {}
        for name, ref in named.items():
            if ref in ready:
                with contextlib.suppress(RayError):
                    metrics[f"system/rss_gb/{name}"] = ray.get(ref)
        metrics.update({f"system/rss_gb/learner_{rank}": gb for rank, gb in enumerate(learners)})
        metrics["system/rss_gb/driver"] = resident_gb()
        return metrics

    def close(self) -> None:
        """End every actor of the run; one that is dead already does not stop the others."""
        import ray

        for closer in (
            lambda: ray.get(self.coordinator.shutdown.remote(), timeout=60),
            lambda: ray.get([e.shutdown.remote() for e in self.engines], timeout=60),
            # killed, not left to handle counting: a handle that outlives the run (a closure, a
            # traceback) kept an engine and its ~5 GB alive through the rest of an experiment
            *(lambda actor=actor: ray.kill(actor) for actor in (self.coordinator, *self.engines)),
            self.learner.shutdown,
        ):
            try:
                closer()
            except Exception as exc:  # cleanup must go on past one dead actor
                log.warning("cleanup step failed: %s", exc)
