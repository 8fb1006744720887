"""The driver's loop, one iteration at a time: rollout -> learner update -> weight sync ->
evaluation -> logs -> checkpoint; under ``driver.pipeline=async`` the next iteration's rollout
runs while the learner trains (``driver.pipeline``).

It runs in the process that starts the run (``python -m selective_rollout.train``, or each arm of
an experiment) and drives the run's actors (``driver.actors``) through Ray. Its settings are the
``driver:`` section; the learner's are ``trainer:``. Everything a run produces lands in its run
folder (resolved config, metrics.jsonl, rollouts.jsonl, checkpoints; the command line adds the
plots and report.md/json once the loop ends); re-running with the same ``driver.run_dir``
resumes from the last complete checkpoint (``trainer.resume=auto``).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path
from typing import Any

from selective_rollout.config import RunConfig, dump_config
from selective_rollout.driver.actors import RunActors, check_resources
from selective_rollout.driver.engine_stats import cache_metrics, engine_busy, engine_counters
from selective_rollout.driver.logs import rewind_logs
from selective_rollout.rollout.stream import StreamStart, advance

log = logging.getLogger(__name__)


class Driver:
    """The loop over a run's iterations, over its actors (``RunActors``)."""

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
        from selective_rollout.reporting.metrics_log import MetricLogger
        from selective_rollout.rollout.engines import check_backend_installed
        from selective_rollout.runtime import held_out_tasks, init_ray, train_tasks
        from selective_rollout.sft import warm_start_model

        self.cfg, self.run_dir = cfg, run_dir
        self.before_eval = before_eval
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / "config.yaml")
        self.ckpt_dir = run_dir / "checkpoints"
        self.state: dict[str, Any] = {
            "iteration": 0,
            "cursor": 0,  # the task stream's position after the last trained batch
            "stream_settled": [],  # stream: indices above the cursor already settled and logged
            "eval": {},
            "wall_s": 0.0,
            "policy_version": 0,  # learner updates taken (the update check's included)
        }
        rewind_logs(run_dir, self.ckpt_dir, cfg.trainer.resume)  # before anything appends to them
        # data and model first: a missing dataset or model fails in seconds, before Ray starts
        self.train_tasks = train_tasks(cfg)
        self.eval_tasks = held_out_tasks(cfg)
        model_path = resolve_model(cfg.engine.model, cfg.engine.model_cache_dir)
        joined = bool(ray_address or os.environ.get("RAY_ADDRESS"))
        if not joined:  # a cluster's engine nodes run their own image; the driver's may differ
            check_backend_installed(cfg.engine.backend)
        init_ray(ray_address)
        check_resources(cfg, joined)
        if cfg.warm_start.enabled:
            model_path = warm_start_model(cfg, model_path)
        actor_model = (
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
        # not joined: Ray was started here, so placement's `auto` allocators see the actors' Ray
        self.actors = RunActors(cfg, run_dir, model_path, actor_model, local_ray=not joined)
        self.logger = MetricLogger(cfg.logging, run_dir, run_dir.name, cfg.model_dump(mode="json"))

    @property
    def engines(self) -> list[Any]:
        return self.actors.engines

    @property
    def learner(self) -> Any:
        return self.actors.learner

    @property
    def coordinator(self) -> Any:
        return self.actors.coordinator

    def send_weights(self, version: int) -> float:
        """Sync the learner's weights, policy ``version``, to every engine and tell the rollout
        service, so that a group it starts from now on carries that version (a rollout may be in
        flight: ``driver.sync_in_flight``); returns the sync's seconds."""
        import ray

        seconds = self.actors.sync_weights(version)
        ray.get(self.coordinator.weights_updated.remote(version), timeout=60)
        return seconds

    def resume(self) -> None:
        """Load the last checkpoint, if any; either way sync the engines once before anything is
        played, so that a sync or serving fault shows in seconds (``verify_served_weights``), not
        after the first evaluation, rollout and learner step."""
        extra = self.learner.resume(self.ckpt_dir)
        if extra is not None:
            self.state.update(extra)
            log.info("resumed at iteration %d from %s", self.state["iteration"], self.ckpt_dir)
        seconds = self.send_weights(int(self.state.get("policy_version", 0)))
        log.info("weight sync at start-up: %.1f s", seconds)

    def check_update(self) -> dict[str, float]:
        """``driver.update_check``: one optimiser step on a constructed group whose rewards differ,
        synced and verified like any update; raises ``UpdateCheckFailed`` unless engine 0 then
        scores the probe differently (``driver.update_check``)."""
        import ray
        from transformers import AutoTokenizer

        from selective_rollout.driver import update_check

        tokenizer = AutoTokenizer.from_pretrained(str(self.actors.model_path))
        prompt = list(tokenizer(update_check.PROMPT)["input_ids"])
        replies = [list(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in update_check.REPLIES]
        logprobs = self.learner.logprobs([[*prompt, *reply] for reply in replies])
        batch = update_check.check_batch(prompt, replies, logprobs)
        before = ray.get(self.engines[0].score.remote(self.actors.probe_ids), timeout=600)
        trained = self.learner.train_step(batch)
        self.state["policy_version"] = self.state.get("policy_version", 0) + 1
        self.send_weights(self.state["policy_version"])
        after = ray.get(self.engines[0].score.remote(self.actors.probe_ids), timeout=600)
        metrics = update_check.verdict(trained, update_check.served_shift(before, after))
        metrics["check/served_logprob_gap"] = self.actors.served_gap
        log.info(
            "update check: loss %.3g, gradient norm %.3g; the served probe moved %.2g nats",
            metrics["check/loss"],
            metrics["check/grad_norm"],
            metrics["check/served_shift"],
        )
        return metrics

    def evaluate(self, label: str) -> dict[str, Any]:
        from selective_rollout.driver.held_out import format_summary, success_summary
        from selective_rollout.runtime import wait_for_coordinator

        self.pipeline.serve_latest()
        started = time.monotonic()
        ref = self.coordinator.evaluate.remote(self.eval_tasks)
        stall_s = self.cfg.driver.stall_timeout_s
        groups = wait_for_coordinator(
            self.coordinator, ref, f"evaluation ({label})", stall_s, self.actors.replace_dead_engines
        )
        # with its wall-clock: what an experiment's held-out precision costs (analysis.power)
        summary = {
            **success_summary(groups, self.cfg.eval.bootstrap, self.cfg.seed),
            "wall_s": time.monotonic() - started,
        }
        self.state["eval"][label] = summary
        log.info("held-out (%s): %s", label, format_summary(summary))
        return summary

    def start_pipeline(self) -> None:
        """The rollout pipeline (``driver.pipeline``) from the state: the engines serve the
        learner's version (synced at start-up)."""
        from selective_rollout.driver.pipeline import RolloutPipeline

        self.pipeline = RolloutPipeline(
            self.cfg.driver.pipeline,
            self.cfg.driver.max_staleness,
            self._start_rollout,
            self._wait_rollout,
            self.send_weights,
            version=int(self.state.get("policy_version", 0)),
            cursor=int(self.state["cursor"]),
            sync_in_flight=self.cfg.driver.sync_in_flight,
            take_stream=self._take_stream if self.cfg.driver.pipeline == "stream" else None,
        )
        self._stream_open = False
        self._taken: dict[str, dict[str, Any]] | None = None  # async: the engines' health at the last batch

    def _start_rollout(self, it: int, cursor: int, version: int) -> Any:
        from selective_rollout.runtime import task_stream

        cfg = self.cfg
        window = int(cfg.rollout.groups_per_iteration * cfg.rollout.max_groups_factor) + 1
        stream = task_stream(self.train_tasks, cfg.driver.task_shuffle_seed, cursor)
        return self.coordinator.rollout.remote(list(itertools.islice(stream, window)), it, version)

    def _take_stream(self, it: int, learner_version: int) -> Any:
        """``driver.pipeline=stream``: batch ``it`` of the rollout service's stream, opened at the
        first take from the state's stream position (a resumed run passes over what it settled)."""
        import ray

        cfg = self.cfg
        if not self._stream_open:
            start = StreamStart(
                self.train_tasks,
                cfg.driver.task_shuffle_seed,
                int(self.state["cursor"]),
                list(self.state.get("stream_settled", [])),
                it,
                cfg.driver.iterations - 1,
                learner_version,
                cfg.driver.max_staleness,
            )
            ray.get(self.coordinator.open_stream.remote(start), timeout=600)
            self._stream_open = True
        return self._wait_rollout(self.coordinator.take.remote(it, learner_version), it)

    def close_stream(self) -> None:
        """Stop the stream once the last batch is taken: what still plays would train nothing."""
        import ray

        if self._stream_open:
            ray.get(self.coordinator.close_stream.remote(), timeout=600)
            self._stream_open = False

    def _wait_rollout(self, ref: Any, it: int) -> Any:
        from selective_rollout.runtime import wait_for_coordinator

        return wait_for_coordinator(
            self.coordinator,
            ref,
            f"rollout of iteration {it}",
            self.cfg.driver.stall_timeout_s,
            self.actors.replace_dead_engines,
        )

    def iteration(self, it: int) -> dict[str, float]:
        import ray

        from selective_rollout.driver.held_out import eval_metrics
        from selective_rollout.reporting.idle import engine_busy_delta, idle_metrics

        cfg = self.cfg
        start = time.perf_counter()
        healths = self.actors.engine_healths()
        restarts = self.actors.engine_restarts
        collected = self.pipeline.take(it)
        batch = collected.batch
        taken = self.actors.engine_healths()
        self.actors.replace_dead_engines(probe=True)  # before the weight sync: a dead member would stall it
        if self.actors.engine_restarts != restarts:
            self.pipeline.engines_replaced()
        if it + 1 < cfg.driver.iterations:
            self.pipeline.prefetch(it + 1)  # async: the engines play on while the learner trains
        metrics = dict(batch.metrics)
        metrics.update(self._pipeline_metrics(collected))
        if batch.experiences:
            metrics.update(self.learner.train_step(batch.experiences, version=self.pipeline.learner_version))
            if not metrics.get("train/skipped"):
                self.pipeline.updated()
        else:
            log.warning("iteration %d: no trainable group (all cut, filtered or failed); no update", it)
        if cfg.driver.pipeline == "stream":
            settled = self.state.get("stream_settled", [])
            self.state["cursor"], self.state["stream_settled"] = advance(
                int(self.state["cursor"]), settled, batch.stream_indices
            )
        else:
            self.state["cursor"] += batch.tasks_consumed
        self.state["policy_version"] = self.pipeline.learner_version
        if cfg.driver.eval_every and (it + 1) % cfg.driver.eval_every == 0 and it + 1 < cfg.driver.iterations:
            metrics.update(eval_metrics(self.evaluate(f"iteration {it + 1}")))
        metrics.update(self._sync_metrics())
        metrics.update(ray.get(self.coordinator.env_metrics.remote()))
        metrics.update(self.actors.memory_metrics())
        metrics["system/engine_restarts"] = float(self.actors.engine_restarts)
        metrics["system/iteration_s"] = time.perf_counter() - start
        after = self.actors.engine_healths()
        # the engines' cache counters over the batch's rollout: sync, from the iteration's start to
        # its batch; async, from the previous batch to this one (the rollout started right after
        # it; a sync's probe and an evaluation in between count too)
        before_rollout = healths if self._taken is None else self._taken
        env_steps = metrics.get("rollout/env_steps", 0.0)
        metrics.update(cache_metrics(engine_counters(before_rollout), engine_counters(taken), env_steps))
        self._taken = taken if cfg.driver.pipelined else None
        busy = engine_busy_delta(engine_busy(healths), engine_busy(after))
        learner_busy = metrics.get("train/step_s", 0.0)
        metrics.update(idle_metrics(busy, len(self.engines), learner_busy, metrics["system/iteration_s"]))
        self.state["wall_s"] += metrics["system/iteration_s"]
        self.state["iteration"] = it + 1
        self.logger.log(metrics, it)
        if (it + 1) % cfg.trainer.save_every == 0 or it + 1 == cfg.driver.iterations:
            self.learner.save_checkpoint(self.ckpt_dir, dict(self.state))
        return metrics

    def _sync_metrics(self) -> dict[str, float]:
        """The weight syncs since the last log line: how many, their seconds and the served gap
        the last one verified (the final evaluation's line logs the sync an async run does before
        it)."""
        syncs, sync_s = self.pipeline.take_syncs()
        if not syncs:
            return {"pipeline/syncs": 0.0}
        return {
            "pipeline/syncs": float(syncs),
            "system/weight_sync_s": sync_s,
            "system/served_logprob_gap": self.actors.served_gap,
        }

    def _pipeline_metrics(self, collected: Any) -> dict[str, float]:
        """The batch's versions and what the learner waited for it (``pipeline/*``)."""
        return {
            "pipeline/rollout_version": float(collected.version),
            "pipeline/learner_version": float(self.pipeline.learner_version),
            "pipeline/staleness": float(self.pipeline.learner_version - collected.version),
            "pipeline/rollout_wait_s": collected.wait_s,
        }

    def run(self) -> None:
        """Resume, train the remaining iterations and evaluate; the run's report is written by the
        caller (``analysis.report.report_run``: the report is analysis, above the driver)."""
        from selective_rollout.driver.held_out import eval_metrics, format_summary

        self.resume()
        if self.cfg.driver.update_check and "update_check" not in self.state:
            self.state["update_check"] = self.check_update()
            self.logger.log(self.state["update_check"], -1)
        self.start_pipeline()
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
        self.close_stream()
        if "after" not in self.state["eval"]:
            after = eval_metrics(self.evaluate("after"))
            self.logger.log({**after, **self._sync_metrics()}, self.cfg.driver.iterations)
            self.save_final_state()

    def save_final_state(self) -> None:
        """Keep the final evaluation across a resume. The last iteration's checkpoint already holds
        these weights: only its driver state is replaced (a full save would write the model and
        the optimizer again, ~12 bytes per parameter, for nothing)."""
        from selective_rollout.learner.checkpoint import (
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
        self.actors.close()
        try:
            self.logger.close()
        except Exception as exc:  # as the actors' cleanup: never raise past it
            log.warning("cleanup step failed: %s", exc)
