"""The driver: owns a run's actors and its loop, one iteration at a time: rollout -> learner
update -> weight sync -> evaluation -> logs -> checkpoint.

It runs in the process that starts the run (``python -m selective_rollout.train``, or each arm of
an experiment) and talks to the coordinator, the engines and the learners as Ray actors. Its
settings are the ``driver:`` section; the learner's are ``trainer:``. Everything a run produces
lands in its run folder (resolved config, metrics.jsonl, rollouts.jsonl, checkpoints, plots,
report.md/json); re-running with the same ``driver.run_dir`` resumes from the last complete
checkpoint (``trainer.resume=auto``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import time
from pathlib import Path
from typing import Any

from selective_rollout.config import RunConfig, dump_config

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


def rewind_logs(run_dir: Path, ckpt_dir: Path, resume: str) -> None:
    """Make the run's logs agree with the checkpoint it resumes from (or with a fresh start).

    Metrics are logged before the checkpoint is saved and groups as they finish, so a run
    killed in between has lines of iterations it will redo; they are moved to ``*.rewound``
    (never deleted), and the resumed run writes them afresh, once.
    """
    from selective_rollout.records import rewind_jsonl
    from selective_rollout.trainer import latest_checkpoint
    from selective_rollout.trainer.checkpoint import read_extra_state

    done, evaluated = 0, set()
    if resume != "never" and (latest := latest_checkpoint(ckpt_dir)) is not None:
        state = read_extra_state(latest)
        done, evaluated = int(state["iteration"]), set(state["eval"])

    def logged_before_the_checkpoint(line: dict[str, Any]) -> bool:
        iteration = int(line.get("iteration", 0))
        if iteration < 0:  # the "before" evaluation
            return "before" in evaluated
        # the "after" evaluation is logged at iteration == driver.iterations, the last one done
        return iteration < done or (iteration == done and "after" in evaluated)

    for name in ("rollouts.jsonl", "metrics.jsonl"):
        if moved := rewind_jsonl(run_dir / name, logged_before_the_checkpoint):
            log.warning("%s: %d line(s) after the checkpoint moved to %s.rewound", name, moved, name)


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


class Driver:
    """Owns the actors of one run and the loop over iterations."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        ray_address: str | None = None,
        before_eval: dict[str, Any] | None = None,
    ) -> None:
        """``before_eval``: the held-out summary of this run's starting weights when it is already
        known (the experiment runner passes an earlier arm's: same warm start, same tasks, and a
        greedy evaluation that scores the same weights the same), so it is not played again."""
        from selective_rollout.models import model_for_actors, resolve_model
        from selective_rollout.placement import resource_demand, wait_for_actors
        from selective_rollout.reporting.metrics_log import MetricLogger
        from selective_rollout.rollout.coordinator import create_coordinator
        from selective_rollout.rollout.engines import check_backend_installed, create_engines
        from selective_rollout.runtime import held_out_tasks, init_ray, train_tasks
        from selective_rollout.sft import warm_start_model
        from selective_rollout.trainer import LearnerGroup

        self.cfg, self.run_dir = cfg, run_dir
        self.before_eval = before_eval
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / "config.yaml")
        self.ckpt_dir = run_dir / "checkpoints"
        self.state: dict[str, Any] = {"iteration": 0, "cursor": 0, "eval": {}, "wall_s": 0.0}
        rewind_logs(run_dir, self.ckpt_dir, cfg.trainer.resume)  # before anything appends to them
        # data and model first: a missing dataset or model fails in seconds, before Ray starts
        self.train_tasks = train_tasks(cfg)
        self.eval_tasks = held_out_tasks(cfg)
        model_path = resolve_model(cfg.engine.model, cfg.engine.model_cache_dir)
        joined = bool(ray_address or os.environ.get("RAY_ADDRESS"))
        self.local_ray = not joined  # placement's `auto` allocators: the actors see the driver's Ray
        if not joined:  # a cluster's engine nodes run their own image; the driver's may differ
            check_backend_installed(cfg.engine.backend)
        init_ray(ray_address)
        self.check_resources(joined)
        if cfg.warm_start.enabled:
            model_path = warm_start_model(cfg, model_path)
        self.model_path = model_path  # on this node; the actors get model_for_actors's handle
        self.actor_model = (
            str(model_path)
            if cfg.warm_start.enabled
            else model_for_actors(cfg.engine.model, model_path, cfg.engine.model_cache_dir)
        )
        log.info(
            "policy: %s; %d train tasks, %d held-out tasks",
            model_path,
            len(self.train_tasks),
            len(self.eval_tasks),
        )
        place = cfg.placement
        local = self.local_ray
        self.engines = create_engines(
            cfg.engine, self.actor_model, cfg.engine.num_engines, place.engine_options(local)
        )
        self.learner = LearnerGroup(
            cfg.trainer,
            self.actor_model,
            seed=cfg.seed,
            actor_options=place.learner_options(local),
            wait_started=lambda refs: wait_for_actors(refs, place.pending_timeout_s, resource_demand(cfg)),
        )
        self.coordinator = create_coordinator(
            cfg,
            self.engines,
            self.actor_model,
            run_dir,
            place.coordinator_options(local),
            place.env_worker_options(),
        )
        self.logger = MetricLogger(cfg.logging, run_dir, run_dir.name, cfg.model_dump(mode="json"))
        self.record_placement()
        self.check_run_dir_is_shared()
        self.engine_restarts = 0

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
            self.learner.sync_weights([engine])
            self.verify_served_weights({f"engine {index}": engine})
            self.engines[index] = engine
            ray.get(self.coordinator.replace_engine.remote(index, engine), timeout=60)
            self.engine_restarts += 1
            log.warning("engine %d died; replaced by a fresh engine with the current weights", index)

    def sync_weights(self, attempts: int = 3) -> float:
        """Send the learner's weights to every engine; returns the seconds the successful sync took.

        An engine that dies during the sync makes it fail within about a second
        (``WeightSyncFailed``, instead of the collective's 300 s timeout): it is replaced like any
        dead engine and the sync re-run on the rebuilt group, which also completes the weights of
        the engines that were receiving, up to ``attempts`` syncs in all."""
        from selective_rollout.trainer import WeightSyncFailed

        for attempt in range(1, attempts + 1):
            try:
                seconds = self.learner.sync_weights(self.engines)
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

    def check_resources(self, joined: bool) -> None:
        """Fail in seconds, with the numbers, when the cluster can never place the run's actors
        (Ray would wait for them forever). On a joined cluster an autoscaler may still add nodes,
        so there it is a warning."""
        import ray

        from selective_rollout.placement import resource_demand, resource_shortfall

        short = resource_shortfall(resource_demand(self.cfg), ray.cluster_resources())
        if not short:
            return
        message = "the cluster cannot place this run's actors: " + "; ".join(short)
        if not joined:
            raise ValueError(message + " (the placement, engine, trainer and env sections ask for them)")
        log.warning(
            "%s; waiting in case an autoscaler adds nodes (actors still pending after "
            "placement.pending_timeout_s=%g s stop the run)",
            message,
            self.cfg.placement.pending_timeout_s,
        )

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

    def resume(self) -> None:
        """Load the last checkpoint, if any; either way sync the engines once before anything is
        played, so that a sync or serving fault shows in seconds (``verify_served_weights``), not
        after the first evaluation, rollout and learner step."""
        extra = self.learner.resume(self.ckpt_dir)
        if extra is not None:
            self.state.update(extra)
            log.info("resumed at iteration %d from %s", self.state["iteration"], self.ckpt_dir)
        seconds = self.sync_weights()
        log.info("weight sync at start-up: %.1f s", seconds)

    def check_update(self) -> dict[str, float]:
        """``driver.update_check``: one optimiser step on a constructed group whose rewards differ,
        synced and verified like any update; raises ``UpdateCheckFailed`` unless engine 0 then
        scores the probe differently (``selective_rollout.update_check``)."""
        import ray
        from transformers import AutoTokenizer

        from selective_rollout import update_check

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        prompt = list(tokenizer(update_check.PROMPT)["input_ids"])
        replies = [list(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in update_check.REPLIES]
        logprobs = self.learner.logprobs([[*prompt, *reply] for reply in replies])
        batch = update_check.check_batch(prompt, replies, logprobs)
        before = ray.get(self.engines[0].score.remote(self.probe_ids), timeout=600)
        trained = self.learner.train_step(batch)
        self.sync_weights()
        after = ray.get(self.engines[0].score.remote(self.probe_ids), timeout=600)
        metrics = update_check.verdict(trained, update_check.served_shift(before, after))
        metrics["check/served_logprob_gap"] = self.served_gap
        log.info(
            "update check: loss %.3g, gradient norm %.3g; the served probe moved %.2g nats",
            metrics["check/loss"],
            metrics["check/grad_norm"],
            metrics["check/served_shift"],
        )
        return metrics

    def evaluate(self, label: str) -> dict[str, Any]:
        from selective_rollout.policy_eval import format_summary, success_summary
        from selective_rollout.runtime import wait_for_coordinator

        started = time.monotonic()
        ref = self.coordinator.evaluate.remote(self.eval_tasks)
        stall_s = self.cfg.driver.stall_timeout_s
        groups = wait_for_coordinator(
            self.coordinator, ref, f"evaluation ({label})", stall_s, self.replace_dead_engines
        )
        # with its wall-clock: what an experiment's held-out precision costs (reporting.power)
        summary = {
            **success_summary(groups, self.cfg.eval.bootstrap, self.cfg.seed),
            "wall_s": time.monotonic() - started,
        }
        self.state["eval"][label] = summary
        log.info("held-out (%s): %s", label, format_summary(summary))
        return summary

    def iteration(self, it: int) -> dict[str, float]:
        import ray

        from selective_rollout.policy_eval import eval_metrics
        from selective_rollout.reporting.idle import engine_busy_delta, idle_metrics
        from selective_rollout.runtime import task_stream, wait_for_coordinator

        cfg = self.cfg
        start = time.perf_counter()
        window = int(cfg.rollout.groups_per_iteration * cfg.rollout.max_groups_factor) + 1
        stream = task_stream(self.train_tasks, cfg.driver.task_shuffle_seed, self.state["cursor"])
        tasks = list(itertools.islice(stream, window))
        healths = self.engine_healths()
        ref = self.coordinator.rollout.remote(tasks, it)
        batch = wait_for_coordinator(
            self.coordinator,
            ref,
            f"rollout of iteration {it}",
            cfg.driver.stall_timeout_s,
            self.replace_dead_engines,
        )
        self.replace_dead_engines(probe=True)  # before the weight sync: a dead member would stall it
        self.state["cursor"] += batch.tasks_consumed
        metrics = dict(batch.metrics)
        env_steps = metrics.get("rollout/env_steps", 0.0)
        metrics.update(
            cache_metrics(engine_counters(healths), engine_counters(self.engine_healths()), env_steps)
        )
        if batch.experiences:
            metrics.update(self.learner.train_step(batch.experiences))
            metrics["system/weight_sync_s"] = self.sync_weights()
            metrics["system/served_logprob_gap"] = self.served_gap
        else:
            log.warning("iteration %d: no trainable group (all cut, filtered or failed); no update", it)
        if cfg.driver.eval_every and (it + 1) % cfg.driver.eval_every == 0 and it + 1 < cfg.driver.iterations:
            metrics.update(eval_metrics(self.evaluate(f"iteration {it + 1}")))
        metrics.update(ray.get(self.coordinator.env_metrics.remote()))
        metrics.update(self.memory_metrics())
        metrics["system/engine_restarts"] = float(self.engine_restarts)
        metrics["system/iteration_s"] = time.perf_counter() - start
        busy = engine_busy_delta(engine_busy(healths), engine_busy(self.engine_healths()))
        learner_busy = metrics.get("train/step_s", 0.0)
        metrics.update(idle_metrics(busy, len(self.engines), learner_busy, metrics["system/iteration_s"]))
        self.state["wall_s"] += metrics["system/iteration_s"]
        self.state["iteration"] = it + 1
        self.logger.log(metrics, it)
        if (it + 1) % cfg.trainer.save_every == 0 or it + 1 == cfg.driver.iterations:
            self.learner.save_checkpoint(self.ckpt_dir, dict(self.state))
        return metrics

    def engine_healths(self) -> dict[int, dict[str, Any]]:
        """Each engine's ``health()`` now, keyed by its handle (a replacement is a new key)."""
        import ray

        healths = ray.get([e.health.remote() for e in self.engines], timeout=60)
        return {id(e): h for e, h in zip(self.engines, healths, strict=True)}

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

    def run(self) -> Path:
        from selective_rollout.policy_eval import eval_metrics, format_summary
        from selective_rollout.reporting.report import write_report

        self.resume()
        if self.cfg.driver.update_check and "update_check" not in self.state:
            self.state["update_check"] = self.check_update()
            self.logger.log(self.state["update_check"], -1)
        if "before" not in self.state["eval"]:
            if self.before_eval is None:
                before = self.evaluate("before")
            else:
                before = self.state["eval"]["before"] = self.before_eval
                log.info(
                    "held-out (before): %s (known for these weights, not played again)",
                    format_summary(before),
                )
            self.logger.log(eval_metrics(before), -1)
        from tqdm import tqdm

        first = self.state["iteration"]
        bar = tqdm(
            range(first, self.cfg.driver.iterations),
            desc="iterations",
            initial=first,
            total=self.cfg.driver.iterations,
            disable=not self.cfg.logging.progress,
            mininterval=5,
        )
        for it in bar:
            m = self.iteration(it)
            bar.set_postfix(
                cut=int(m.get("rollout/groups_cut", 0)),
                kept=int(m.get("rollout/groups_completed", 0)),
                success=f"{m.get('rollout/success_rate', 0):.2f}",
            )
        if "after" not in self.state["eval"]:
            self.logger.log(eval_metrics(self.evaluate("after")), self.cfg.driver.iterations)
            self.save_final_state()
        return write_report(self.run_dir, self.state, self.cfg.regime_k)

    def save_final_state(self) -> None:
        """Keep the final evaluation across a resume. The last iteration's checkpoint already holds
        these weights: only its driver state is replaced (a full save would write the model and
        the optimizer again, ~12 bytes per parameter, for nothing)."""
        from selective_rollout.trainer.checkpoint import (
            latest_checkpoint,
            read_extra_state,
            update_extra_state,
        )

        latest = latest_checkpoint(self.ckpt_dir)
        if latest is not None and read_extra_state(latest).get("iteration") == self.state["iteration"]:
            update_extra_state(latest, dict(self.state))
        else:
            self.learner.save_checkpoint(self.ckpt_dir, dict(self.state))

    def close(self) -> None:
        import ray

        for closer in (
            lambda: ray.get(self.coordinator.shutdown.remote(), timeout=60),
            lambda: ray.get([e.shutdown.remote() for e in self.engines], timeout=60),
            # killed, not left to handle counting: a handle that outlives the run (a closure, a
            # traceback) kept an engine and its ~5 GB alive through the rest of an experiment
            *(lambda actor=actor: ray.kill(actor) for actor in (self.coordinator, *self.engines)),
            self.learner.shutdown,
            self.logger.close,
        ):
            try:
                closer()
            except Exception as exc:  # cleanup must go on past one dead actor
                log.warning("cleanup step failed: %s", exc)


def cache_metrics(
    before: dict[Any, tuple[int, int]], after: dict[Any, tuple[int, int]], env_steps: float
) -> dict[str, float]:
    """What the engines' prompt caches did between two ``engine_counters`` readings: the share of
    prompt tokens served from cache and the tokens prefilled per env step. A multi-turn dialogue
    should prefill about one turn's new tokens a step; its whole length means a bypassed cache.
    An engine that is new since ``before`` (a replacement) counts from zero."""
    cached = prefilled = 0
    for key, (c, f) in after.items():
        c0, f0 = before.get(key, (0, 0))
        cached, prefilled = cached + c - c0, prefilled + f - f0
    if cached + prefilled <= 0:
        return {}
    return {
        "system/prefix_cache_hit_rate": cached / (cached + prefilled),
        "system/prefilled_tokens_per_env_step": prefilled / env_steps if env_steps else 0.0,
    }


def engine_counters(healths: dict[int, dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Each engine's (prompt tokens served from cache, prompt tokens prefilled) so far."""
    return {
        k: (int(h.get("cached_tokens", 0)), int(h.get("prefilled_tokens", 0))) for k, h in healths.items()
    }


def engine_busy(healths: dict[int, dict[str, Any]]) -> dict[int, float]:
    """Each engine's busy clock so far (seconds with a request in flight)."""
    return {k: float(h.get("busy_s", 0.0)) for k, h in healths.items()}
