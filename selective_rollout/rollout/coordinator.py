"""GroupCoordinator: turns a stream of tasks into a batch of finished, trainable groups.

It is the only place where engines, environments and gates meet. Groups run
concurrently (up to ``max_groups_in_flight``) and, inside a group, each trajectory runs at its
own pace, so while one waits on the environment others generate and the engines batch
requests across groups. A group the gate stops is cancelled at once (its in-flight engine
requests aborted, its episodes closed, its KV sessions released) and, with ``refill``, the
next task starts immediately: that is how saved tokens become saved wall-clock.

``mode: lockstep`` reproduces the paper's loop (one group at a time, all G trajectories in
lock-step, every turn one batched engine round and one environment step) for fair A/B runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.exceptions import RayActorError, RayTaskError

from selective_rollout.config import RunConfig
from selective_rollout.config.placement import COORDINATOR_NUM_CPUS
from selective_rollout.gate import NoGate
from selective_rollout.gate.audit import AuditBudget
from selective_rollout.models import model_here
from selective_rollout.plugins import STRATEGIES
from selective_rollout.records import (
    Experience,
    GroupRecord,
    GroupWriter,
    Outcome,
    Step,
    Task,
    TrajectoryStatus,
    read_groups,
)
from selective_rollout.rollout.dialogue import GeneratedTurn
from selective_rollout.rollout.engines import SamplingParams
from selective_rollout.rollout.group_run import GroupRun, TrajectoryRun

if TYPE_CHECKING:
    from selective_rollout.rollout.agent import Agent

log = logging.getLogger(__name__)

WORKER_DIED = (RayActorError, RayTaskError, ConnectionError)


class GroupFailed(RuntimeError):
    """An engine or environment worker died under a group."""


class BadGame(GroupFailed):
    """The task's game cannot be played: never retried, and skipped for the rest of the run."""


@dataclass
class RolloutBatch:
    """What one iteration's rollout hands the learner and the logger."""

    experiences: list[Experience]
    groups: list[GroupRecord]
    metrics: dict[str, float]
    tasks_consumed: int  # how far the task cursor moved (skipped tasks included)
    kept_group_ids: list[str] = field(default_factory=list)


class GroupCoordinator:
    """Runs gated group rollouts over engines (Ray actors) and an environment's pool
    (``selective_rollout.envs.EnvPool``); the run's environment (``cfg.env``) gives the reward
    rule and says which errors mean an unplayable game.

    Wrap it with ``ray.remote`` to run it as an actor (see ``create_coordinator``); it is also
    usable in-process, which is how its unit tests drive it.
    """

    def __init__(
        self,
        cfg: RunConfig,
        engines: Sequence[Any],
        env_pool: Any,
        agent: Agent,
        run_dir: str | Path | None = None,
    ) -> None:
        if not engines:
            raise ValueError("the coordinator needs at least one rollout engine")
        self.cfg = cfg
        self.rc = cfg.rollout
        self.engines = list(engines)
        self.env = env_pool
        self.environment = cfg.env.build()
        self.agent = agent
        self.strategy = STRATEGIES.build(self.rc.strategy, self.rc, seed=cfg.seed)
        self.gate = cfg.gate.build() if self.strategy.uses_gate else NoGate()
        self.writer = GroupWriter(Path(run_dir) / "rollouts.jsonl") if run_dir is not None else None
        # a gate with memory first learns the earlier runs it is given, then, in a resumed run,
        # what it had observed in this one (the driver has already rewound the log to the
        # checkpoint), so it resumes where it stopped
        for path in [*cfg.gate.observe_logs, *([self.writer.path] if self.writer is not None else [])]:
            for record in read_groups(Path(path).expanduser()):
                self.gate.observe(record)
        self.audits = AuditBudget(self.rc.audit_budget, self.rc.audit_target_precision)
        self._group_seq = 0
        self._engine_rr = 0
        self._dead_engines: set[int] = set()
        self._engine_back: asyncio.Event | None = None  # set when a replacement engine arrives
        self._tokens = 0
        self._env_steps = 0
        self._active: set[asyncio.Task] = set()  # group tasks in flight, cancelled by close()
        self._bad_games: dict[str, str] = {}  # task id -> why its game cannot be played

    # ------------------------------------------------------------------ scheduling
    async def rollout(self, tasks: Sequence[Task], iteration: int = 0) -> RolloutBatch:
        """Roll out groups from ``tasks`` (in order) until the iteration's batch is complete.

        With ``refill`` the batch is topped up to ``groups_per_iteration`` trainable groups
        (cut, filtered and failed groups are replaced by new tasks) up to a cap of
        ``max_groups_factor`` x target started groups; without it exactly the target number of
        groups is started and cut ones simply leave the batch (the paper's protocol).
        """
        target = self.rc.groups_per_iteration
        cap = target if not self.rc.refill else max(target, int(target * self.rc.max_groups_factor))
        in_flight_cap = 1 if self.rc.mode == "lockstep" else self.rc.max_groups_in_flight
        start_tokens, start_steps, t0 = self._tokens, self._env_steps, time.perf_counter()
        cursor, started = 0, 0
        retries: list[Task] = []
        retried: set[str] = set()
        kept: list[GroupRun] = []
        records: list[GroupRecord] = []
        running: dict[asyncio.Task, tuple[Task, GroupRun]] = {}

        def want_more() -> bool:
            if started >= cap:
                return False
            return len(kept) + len(running) < target

        def work_left() -> bool:
            return want_more() and bool(retries or cursor < len(tasks))

        while True:
            while work_left() and len(running) < in_flight_cap and self._live_engines():
                if retries:
                    task = retries.pop(0)
                else:
                    task = tasks[cursor]
                    cursor += 1
                    if task.task_id in self._bad_games:
                        records.append(self._skipped_record(task, iteration, self._bad_games[task.task_id]))
                        continue
                    if not self.strategy.admit(task.task_id):
                        records.append(self._skipped_record(task, iteration, "skipped by the strategy"))
                        continue
                group = self._new_group(task, iteration)
                runner = self._run_group_lockstep if self.rc.mode == "lockstep" else self._run_group
                fut = asyncio.create_task(runner(task, group))
                self._active.add(fut)
                fut.add_done_callback(self._active.discard)
                running[fut] = (task, group)
                started += 1
            if not running:
                if work_left() and not self._live_engines():
                    await self._wait_for_a_replacement_engine()
                    continue
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                task, group = running.pop(fut)
                exc = fut.exception()
                if exc is not None and not isinstance(exc, GroupFailed):
                    await _cancel_all(running)
                    raise exc
                if isinstance(exc, BadGame):
                    self._bad_games[task.task_id] = str(exc)
                    log.warning("%s; the task is skipped from now on", exc)
                if exc is not None:
                    group.failure = str(exc)
                    if self.rc.retry_failed and task.task_id not in retried and not isinstance(exc, BadGame):
                        retried.add(task.task_id)
                        retries.append(task)
                zero = group.zero_variance()
                keep = (
                    group.failure is None and not group.fired and (zero is None or self.strategy.keep(zero))
                )
                outcome = group.outcome(keep)
                self.strategy.observe(task.task_id, zero)
                meta = {"engine": group.engine_index}
                if group.failure is not None:
                    meta["failure"] = group.failure
                record = group.to_record(iteration, outcome, meta)
                self.audits.observe(record, audit_chosen=group.audit)
                self.gate.observe(record)  # a gate with memory (history, audits) learns here
                records.append(record)
                if self.writer is not None:
                    self.writer.write(record)
                if record.trained_on:
                    kept.append(group)
        metrics = self._metrics(records, time.perf_counter() - t0, start_tokens, start_steps)
        experiences = [e for g in kept for e in g.experiences()]
        return RolloutBatch(experiences, records, metrics, cursor, [g.group_id for g in kept])

    def _new_group(self, task: Task, iteration: int) -> GroupRun:
        group_id = self._next_group_id(iteration)
        group = GroupRun(group_id, task.task_id, task.task_type, self.rc.group_size, self.gate, self.audits)
        group.engine_index = self._pick_engine()
        group.sample_key = f"{self.cfg.seed}:{iteration}:{task.task_id}"
        return group

    def _skipped_record(self, task: Task, iteration: int, reason: str) -> GroupRecord:
        record = GroupRecord(
            self._next_group_id(iteration),
            task.task_id,
            task.task_type,
            [],
            Outcome.SKIPPED,
            iteration,
            meta={"skipped": reason},
        )
        if self.writer is not None:
            self.writer.write(record)
        return record

    def _next_group_id(self, iteration: int) -> str:
        """``it3-g17``: the iteration in the id keeps ids unique across a resume, which restarts
        the counter but never the iteration (evaluation groups: ``eval-g5``)."""
        self._group_seq += 1
        return f"{'eval' if iteration < 0 else f'it{iteration}'}-g{self._group_seq}"

    def _live_engines(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self._dead_engines]

    def _pick_engine(self) -> int:
        alive = self._live_engines()
        if not alive:
            raise RuntimeError("every rollout engine has died; the rollout cannot continue")
        self._engine_rr += 1
        return alive[self._engine_rr % len(alive)]

    def dead_engines(self) -> list[int]:
        """Slots whose engine died (the driver replaces them, see ``replace_engine``)."""
        return sorted(self._dead_engines)

    def replace_engine(self, index: int, engine: Any) -> None:
        """A fresh engine, already holding the current weights, takes over slot ``index``."""
        self.engines[index] = engine
        self._dead_engines.discard(index)
        if self._engine_back is not None:
            self._engine_back.set()

    async def _wait_for_a_replacement_engine(self) -> None:
        """Every engine is dead and groups are still to run: wait for the driver's replacement."""
        timeout = self.rc.engine_replace_timeout_s
        self._engine_back = asyncio.Event()
        log.warning("every rollout engine has died; waiting up to %.0f s for a replacement", timeout)
        try:
            await asyncio.wait_for(self._engine_back.wait(), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"every rollout engine has died and none was replaced within {timeout:.0f} s "
                "(rollout.engine_replace_timeout_s)"
            ) from None
        finally:
            self._engine_back = None

    # ------------------------------------------------------------------ one group
    async def _open_group(self, task: Task, group: GroupRun) -> None:
        try:
            states = await self.env.reset_group(task.game_dir, self.rc.group_size)
        except self.environment.game_errors() as exc:
            raise BadGame(f"task {task.task_id}: bad game {exc}") from None
        except WORKER_DIED as exc:
            raise GroupFailed(f"env worker died while opening {task.task_id}: {exc}") from exc
        for i, st in enumerate(states):
            if st.failed:
                raise GroupFailed(f"env worker failed opening {task.task_id}: {st.failed}")
            conversation = self.agent.start(st.task, st.obs, st.admissible)
            traj = TrajectoryRun(i, st.episode_id, f"{group.group_id}-t{i}", conversation)
            traj.admissible = st.admissible
            group.trajectories.append(traj)

    async def _run_group(self, task: Task, group: GroupRun) -> None:
        """Concurrent mode: every trajectory runs at its own pace; the gate may cancel them all."""
        await self._open_group(task, group)
        loops = [asyncio.create_task(self._trajectory_loop(group, t)) for t in group.trajectories]
        try:
            while loops:
                done, pending = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    fut.result()
                loops = list(pending)
                if group.stopped:
                    await self._cancel(group, loops)
                    loops = []
        except GroupFailed:
            await self._cancel(group, loops)
            raise
        finally:
            await self._close(group)

    async def _trajectory_loop(self, group: GroupRun, traj: TrajectoryRun) -> None:
        engine = self.engines[group.engine_index]
        while traj.live and not group.stopped:
            if self.rc.hold_at_gate:
                await group.hold_for_gate(traj)
                if group.stopped:
                    return
            turn = await self._generate(group, traj, engine)
            if turn is None or group.stopped:
                return
            state = await self._env_step(group, {traj.episode_id: turn.command})
            self._apply(group, traj, turn, state[traj.episode_id])

    async def _run_group_lockstep(self, task: Task, group: GroupRun) -> None:
        """The paper's loop: each turn all live trajectories generate, then all step together.

        Each trajectory keeps its KV session across turns, as the paper's vLLM server with
        ``enable_prefix_caching=True`` re-uses the dialogue's prefix: a lock-step reference that
        re-prefilled every turn would hand the concurrent coordinator a caching win that is not
        concurrency's."""
        await self._open_group(task, group)
        engine = self.engines[group.engine_index]
        try:
            while not group.stopped:
                live = [t for t in group.trajectories if t.live]
                if not live:
                    return
                turns = await asyncio.gather(*(self._generate(group, t, engine) for t in live))
                actions = {t.episode_id: turn.command for t, turn in zip(live, turns, strict=True)}
                states = await self._env_step(group, actions)
                for t, turn in zip(live, turns, strict=True):
                    self._apply(group, t, turn, states[t.episode_id])
        finally:
            await self._close(group)

    async def _generate(self, group: GroupRun, traj: TrajectoryRun, engine: Any) -> GeneratedTurn | None:
        """One engine call for one trajectory, in its KV session: its reply parsed into a command,
        None on abort."""
        sampling = self._sampling(group, traj)
        traj.request_id = f"{traj.session_id}-s{len(traj.steps)}"
        prompt = traj.conversation.prompt_ids
        try:
            completion = await engine.generate.remote(traj.request_id, prompt, sampling, traj.session_id)
        except (RayActorError, ConnectionError) as exc:  # the actor is gone: replaced by the driver
            self._dead_engines.add(group.engine_index)
            raise GroupFailed(f"engine {group.engine_index} died during {traj.request_id}: {exc}") from exc
        except RayTaskError as exc:  # the request failed; the engine lives on
            raise GroupFailed(f"engine {group.engine_index} failed {traj.request_id}: {exc}") from exc
        finally:
            traj.request_id = None
        out = completion.outputs[0]
        if out.finish_reason == "abort":
            return None
        parsed = self.agent.parse(out.text, traj.admissible)
        self._tokens += len(out.token_ids)
        return GeneratedTurn(
            command=parsed.command,
            valid=parsed.valid,
            text=out.text,
            token_ids=tuple(out.token_ids),
            logprobs=tuple(out.logprobs),
            prompt_tokens=completion.prompt_tokens,
        )

    def _sampling(self, group: GroupRun, traj: TrajectoryRun) -> SamplingParams:
        """The turn's sampling parameters, seeded by (run seed, iteration, task, trajectory, step):
        a trajectory samples the same tokens whatever else the engine batches with it, so runs
        repeat, and the arms of an experiment that reach the same task with the same weights
        sample it alike (their differences are the strategies', not the scheduler's)."""
        ec = self.cfg.engine
        key = f"{group.sample_key}:{traj.index}:{len(traj.steps)}"
        return self.agent.sampling(
            traj.admissible,
            SamplingParams(
                max_tokens=ec.max_new_tokens,
                temperature=ec.temperature,
                top_p=ec.top_p,
                seed=zlib.crc32(key.encode()) & 0x7FFFFFFF,
            ),
        )

    async def _env_step(self, group: GroupRun, actions: dict[str, str]) -> dict[str, Any]:
        try:
            states = await self.env.step(actions)
        except WORKER_DIED as exc:
            raise GroupFailed(f"env worker died stepping {group.group_id}: {exc}") from exc
        for st in states.values():
            if st.failed:
                raise GroupFailed(f"env episode {st.episode_id} of {group.group_id} failed: {st.failed}")
        self._env_steps += len(actions)
        return states

    def _apply(self, group: GroupRun, traj: TrajectoryRun, turn: GeneratedTurn, state: Any) -> None:
        """Record one step of one trajectory and extend its dialogue for the next turn."""
        traj.steps.append(
            Step(
                action=turn.command,
                valid=turn.valid,
                prompt_tokens=turn.prompt_tokens,
                completion_tokens=len(turn.token_ids),
                reward=float(state.reward),
                done=bool(state.done),
            )
        )
        traj.conversation.add_completion(turn.token_ids, turn.text, turn.logprobs)
        traj.won = bool(state.won)
        if state.done or state.won:
            traj.status = TrajectoryStatus.FINISHED
        elif len(traj.steps) >= self.rc.max_steps:
            traj.status = TrajectoryStatus.TRUNCATED
        if not traj.live:
            traj.reward = self.environment.reward(state)
        else:
            traj.admissible = state.admissible
            traj.conversation.extend(state.obs, state.admissible)
        group.after_step(traj)

    async def _cancel(self, group: GroupRun, loops: list[asyncio.Task]) -> None:
        """Stop a group now: abort its in-flight requests, then cancel its trajectory loops."""
        in_flight = [t.request_id for t in group.trajectories if t.request_id]
        if in_flight:
            try:
                await self.engines[group.engine_index].abort.remote(in_flight)
            except WORKER_DIED:
                log.warning("engine %d died while aborting %s", group.engine_index, group.group_id)
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    async def _close(self, group: GroupRun) -> None:
        """Free the group's episodes and KV sessions (also after a failure)."""
        episodes = [t.episode_id for t in group.trajectories]
        sessions = [t.session_id for t in group.trajectories]
        try:
            if episodes:
                await self.env.close(episodes)
            if sessions and group.engine_index not in self._dead_engines:
                await self.engines[group.engine_index].release.remote(sessions)
        except WORKER_DIED as exc:
            log.warning("could not free the resources of %s: %s", group.group_id, exc)

    # ------------------------------------------------------------------ metrics
    def _metrics(
        self, records: list[GroupRecord], wall: float, tokens0: int, steps0: int
    ) -> dict[str, float]:
        outcomes = Counter(r.outcome for r in records)
        labelled = [r for r in records if r.zero_variance is not None]
        audited = [r for r in records if r.outcome is Outcome.AUDITED]
        fired = [r for r in records if r.gate is not None and r.gate.stop]
        tokens, steps = self._tokens - tokens0, self._env_steps - steps0
        invalid = [s.valid for r in records for t in r.trajectories for s in t.steps]
        metrics: dict[str, float] = {
            "rollout/groups_started": float(sum(v for k, v in outcomes.items() if k is not Outcome.SKIPPED)),
            "rollout/groups_completed": float(outcomes[Outcome.COMPLETED]),
            "rollout/groups_trained": float(sum(r.trained_on for r in records)),
            "rollout/groups_cut": float(outcomes[Outcome.CUT]),
            "rollout/groups_audited": float(outcomes[Outcome.AUDITED]),
            "rollout/groups_filtered": float(outcomes[Outcome.FILTERED]),
            "rollout/groups_skipped": float(outcomes[Outcome.SKIPPED]),
            "rollout/groups_failed": float(outcomes[Outcome.FAILED]),
            "rollout/zero_var_frac": sum(r.zero_variance for r in labelled) / len(labelled)
            if labelled
            else 0.0,
            "rollout/step_tokens": float(sum(r.step_tokens for r in records)),
            "rollout/env_steps": float(steps),
            "rollout/invalid_action_frac": (1 - sum(invalid) / len(invalid)) if invalid else 0.0,
            "rollout/success_rate": _mean(
                [t.won for r in records for t in r.trajectories if t.reward is not None]
            ),
            "rollout/wall_s": wall,
            "gate/fires": float(len(fired)),
            "system/tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "system/env_steps_per_s": steps / wall if wall > 0 else 0.0,
        }
        metrics.update({f"gate/{key}": float(value) for key, value in self.gate.metrics().items()})
        if audited:
            metrics["gate/audit_n"] = float(len(audited))
            metrics["gate/audit_precision"] = sum(bool(r.zero_variance) for r in audited) / len(audited)
        return metrics

    def close(self) -> None:
        """Stop: cancel groups still in flight (an interrupted run), then close the log.

        Every group already decided is on disk; a cancelled one was never written, so
        rollouts.jsonl stays a list of whole groups.
        """
        for fut in list(self._active):
            fut.cancel()
        if self.writer is not None:
            self.writer.close()


async def _cancel_all(running: dict[asyncio.Task, Any]) -> None:
    for fut in running:
        fut.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


class CoordinatorActor:
    """The coordinator as a Ray actor: builds the environment's pool and the Agent next to the loop.

    The pool lives inside this actor so that environment calls go straight from the
    coordinator to the env workers without a hop through the driver.
    """

    def __init__(
        self,
        cfg_data: dict[str, Any],
        engines: Sequence[Any],
        model_path: str,
        run_dir: str | None,
        env_worker_options: dict[str, Any] | None = None,
    ) -> None:
        from selective_rollout.rollout.agent import Agent

        cfg = RunConfig.model_validate(cfg_data)
        environment = cfg.env.build()
        self.pool = environment.pool(env_worker_options)
        agent = Agent.from_model(cfg.agent, model_here(model_path), environment.prompt)
        self.coordinator = GroupCoordinator(cfg, engines, self.pool, agent, run_dir)

        self.evaluator = GroupCoordinator(evaluation_config(cfg), engines, self.pool, agent, None)

    async def rollout(self, tasks: Sequence[Task], iteration: int) -> RolloutBatch:
        return await self.coordinator.rollout(tasks, iteration)

    async def evaluate(self, tasks: Sequence[Task]) -> list[GroupRecord]:
        """Held-out episodes with the current weights: one group of ``eval.tries`` per task."""
        batch = await self.evaluator.rollout(tasks, iteration=-1)
        return batch.groups

    async def env_metrics(self) -> dict[str, float]:
        return await self.pool.metrics()

    async def dead_engines(self) -> list[int]:
        return sorted(set(self.coordinator.dead_engines()) | set(self.evaluator.dead_engines()))

    async def replace_engine(self, index: int, engine: Any) -> None:
        self.coordinator.replace_engine(index, engine)
        self.evaluator.replace_engine(index, engine)

    async def progress(self) -> tuple[int, int]:
        """Generated tokens and env steps so far (training and evaluation): the driver's liveness probe."""
        c, e = self.coordinator, self.evaluator
        return (c._tokens + e._tokens, c._env_steps + e._env_steps)

    async def env_worker_pids(self) -> list[int]:
        return await self.pool.worker_pids()

    async def sees(self, path: str) -> bool:
        """Whether ``path`` exists from this actor's node (it writes the run's rollouts.jsonl)."""
        return Path(path).exists()

    async def resident_gb(self) -> float:
        """Resident memory of this actor's process (``system/rss_gb/coordinator``)."""
        from selective_rollout.process_memory import resident_gb

        return resident_gb()

    async def placement(self) -> dict[str, list[dict[str, Any]]]:
        """Where this actor and its env workers run (the driver adds engines and learners)."""
        from selective_rollout.placement import here

        return {"coordinator": [here()], "env_workers": await self.pool.worker_locations()}

    async def shutdown(self) -> None:
        self.coordinator.close()
        self.pool.shutdown()


def evaluation_config(cfg: RunConfig) -> RunConfig:
    """The run's config turned into held-out evaluation: no gate, no filter, every task once,
    ``eval.max_in_flight`` tasks at a time (one by default, so that the engine decodes a greedy
    episode alone and the same weights always score the same)."""
    ec = cfg.eval
    rollout = cfg.rollout.model_copy(
        update={
            "strategy": "none",
            "group_size": ec.tries,
            "groups_per_iteration": ec.num_tasks,
            "max_groups_in_flight": ec.max_in_flight,
            "refill": False,
            "audit_budget": 0.0,
            "retry_failed": True,
        }
    )
    engine = cfg.engine.model_copy(update={"temperature": 0.0} if ec.greedy else {})
    return cfg.model_copy(update={"rollout": rollout, "engine": engine})


def create_coordinator(
    cfg: RunConfig,
    engines: Sequence[Any],
    model_path: str | Path,
    run_dir: str | Path | None,
    actor_options: dict[str, Any] | None = None,
    env_worker_options: dict[str, Any] | None = None,
) -> Any:
    """Start the coordinator actor (it is light: one CPU share, mostly waiting on others)."""
    import ray

    options = {"num_cpus": COORDINATOR_NUM_CPUS, **(actor_options or {})}
    return (
        ray.remote(CoordinatorActor)
        .options(**options)
        .remote(
            cfg.model_dump(mode="json"),
            list(engines),
            str(model_path),
            None if run_dir is None else str(run_dir),
            env_worker_options,
        )
    )


PROBE_S = 30.0


def wait_for_coordinator(
    coordinator: Any,
    ref: Any,
    what: str,
    stall_timeout_s: float,
    on_probe: Callable[[], None] | None = None,
) -> Any:
    """``ray.get(ref)`` that cannot wait forever: it polls the coordinator's progress and stops
    with one clear message when nothing moved (no generated token, no env step) for
    ``stall_timeout_s``, or when the coordinator stops answering. A dead coordinator already
    surfaces as the ref's own error. ``on_probe`` runs at every poll (the driver replaces dead
    engines there)."""
    import ray
    from ray.exceptions import GetTimeoutError

    last, still = None, 0.0
    while True:
        ready, _ = ray.wait([ref], timeout=min(PROBE_S, stall_timeout_s))
        if ready:
            return ray.get(ref)
        if on_probe is not None:
            on_probe()
        try:
            progress = ray.get(coordinator.progress.remote(), timeout=PROBE_S)
        except GetTimeoutError:
            progress = None
        if progress is not None and progress != last:
            last, still = progress, 0.0
            continue
        still += min(PROBE_S, stall_timeout_s)
        if still >= stall_timeout_s:
            state = "does not answer" if progress is None else "made no progress (no token, no env step)"
            raise RuntimeError(
                f"{what}: the coordinator {state} for {still:.0f} s; stopping instead of waiting forever "
                "(its log: the CoordinatorActor lines above, or /tmp/ray/session_latest/logs; the limit "
                "is train.stall_timeout_s)"
            )
