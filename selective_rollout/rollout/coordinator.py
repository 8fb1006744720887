"""The concurrent coordinator, and the Ray actor that hosts the run's rollout source (the
``RolloutService`` the driver talks to, rollout/service.py).

``GroupCoordinator`` turns a stream of tasks into a batch of finished, trainable groups. Groups run
concurrently (up to ``max_groups_in_flight``) and, inside a group, each trajectory runs at its own
pace, so while one waits on the environment others generate and the engines batch requests
across groups. A group the gate cuts is cancelled at once (its in-flight engine requests aborted,
its episodes closed, its KV sessions released) and, with ``refill``, the next task starts
immediately: that is how saved tokens become saved wall-clock.

``rollout.mode`` selects the rollout source the actor runs: this one, or the paper's lock-step
loop (rollout/lockstep.py) for fair A/B runs. Both are ``GroupScheduler``s over the same ``Turns``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selective_rollout.config import RunConfig
from selective_rollout.config.placement import COORDINATOR_NUM_CPUS
from selective_rollout.config.trajectory_stop import TrajectoryStopConfig
from selective_rollout.models import model_here
from selective_rollout.records import GroupRecord, Task
from selective_rollout.rollout.group_run import GroupRun, TrajectoryRun
from selective_rollout.rollout.scheduler import GroupScheduler
from selective_rollout.rollout.service import RolloutService
from selective_rollout.rollout.source import ROLLOUT_MODES, RolloutBatch
from selective_rollout.rollout.stream import GroupStream, StreamStart
from selective_rollout.rollout.turns import EngineHandle, GroupFailed

if TYPE_CHECKING:
    from selective_rollout.envs.base import EnvPool
    from selective_rollout.rollout.agent import Agent


class GroupCoordinator(GroupScheduler):
    """Every trajectory runs at its own pace; the gate may cancel them all."""

    @property
    def in_flight(self) -> int:
        return self.rc.max_groups_in_flight

    async def play(self, group: GroupRun) -> None:
        engine = self.turns.slots[group.engine_index]
        loops = [asyncio.create_task(self._trajectory_loop(group, t, engine)) for t in group.trajectories]
        try:
            while loops:
                done, pending = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    fut.result()
                loops = list(pending)
                if group.life.stopped:
                    await self._cancel(group, loops)
                    loops = []
        except (GroupFailed, asyncio.CancelledError):
            # failed, or cancelled from outside (a closed stream, a shutdown): the loops are tasks
            # of their own and would play on, their requests decoding, unless stopped here
            await self._cancel(group, loops)
            raise

    async def _trajectory_loop(self, group: GroupRun, traj: TrajectoryRun, engine: EngineHandle) -> None:
        while traj.live and not group.life.stopped:
            if self.rc.hold_at_gate:
                await group.hold_for_gate(traj)
                if group.life.stopped:
                    return
            turn = await self.turns.generate(group, traj, engine)
            if turn is None or group.life.stopped:
                return
            state = await self.turns.step(group, {traj.episode_id: turn.command})
            self.turns.apply(group, traj, turn, state[traj.episode_id])

    async def _cancel(self, group: GroupRun, loops: list[asyncio.Task]) -> None:
        """Stop a group now: abort its in-flight requests, then cancel its trajectory loops."""
        await self.turns.abort(group)
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)


def rollout_source(
    cfg: RunConfig,
    engines: Sequence[EngineHandle],
    pool: EnvPool,
    agent: Agent,
    run_dir: str | Path | None = None,
) -> GroupScheduler:
    """The rollout source ``rollout.mode`` names (``ROLLOUT_MODES``), over these engines,
    pool and agent."""
    return ROLLOUT_MODES.get(cfg.rollout.mode)(cfg, engines, pool, agent, run_dir)


class CoordinatorActor(RolloutService):
    """The rollout service as a Ray actor: builds the environment's pool and the Agent next to the
    loop; a thin wrapper over the run's rollout source and the evaluation's.

    The pool lives inside this actor so that environment calls go straight from the
    coordinator to the env workers without a hop through the driver.
    """

    def __init__(
        self,
        cfg_data: dict[str, Any],
        engines: Sequence[EngineHandle],
        model_path: str,
        run_dir: str | None,
        env_worker_options: dict[str, Any] | None = None,
    ) -> None:
        from selective_rollout.rollout.agent import Agent

        cfg = RunConfig.model_validate(cfg_data)
        environment = cfg.env.build()
        self.pool = environment.pool(env_worker_options)
        agent = Agent.from_model(cfg.agent, model_here(model_path), environment.prompt)
        self.coordinator = rollout_source(cfg, engines, self.pool, agent, run_dir)
        self.evaluator = rollout_source(evaluation_config(cfg), engines, self.pool, agent)
        self.stream: GroupStream | None = None

    async def rollout(self, tasks: Sequence[Task], iteration: int, version: int = 0) -> RolloutBatch:
        return await self.coordinator.rollout(tasks, iteration, version)

    async def open_stream(self, start: StreamStart) -> None:
        from selective_rollout.runtime import task_stream

        await self.close_stream()
        tasks = task_stream(start.tasks, start.shuffle_seed, start.cursor)
        self.stream = GroupStream(self.coordinator, tasks, start)

    async def take(self, iteration: int, learner_version: int) -> RolloutBatch:
        if self.stream is None:
            raise RuntimeError("no stream is open: open_stream first (driver.pipeline=stream)")
        return await self.stream.take(iteration, learner_version)

    async def close_stream(self) -> None:
        if self.stream is not None:
            await self.stream.close()
            self.stream = None

    async def evaluate(self, tasks: Sequence[Task]) -> list[GroupRecord]:
        batch = await self.evaluator.rollout(tasks, iteration=-1)
        return batch.groups

    async def env_metrics(self) -> dict[str, float]:
        return await self.pool.metrics()

    async def dead_engines(self) -> list[int]:
        return sorted(set(self.coordinator.dead_engines()) | set(self.evaluator.dead_engines()))

    async def replace_engine(self, index: int, engine: EngineHandle) -> None:
        self.coordinator.replace_engine(index, engine)
        self.evaluator.replace_engine(index, engine)

    async def weights_updated(self, version: int) -> None:
        self.coordinator.version = self.evaluator.version = version
        if self.stream is not None:
            self.stream.weights_updated()

    async def progress(self) -> tuple[int, int]:
        (tokens, steps), (eval_tokens, eval_steps) = self.coordinator.progress(), self.evaluator.progress()
        return tokens + eval_tokens, steps + eval_steps

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
        from selective_rollout.process_memory import here

        return {"coordinator": [here()], "env_workers": await self.pool.worker_locations()}

    async def shutdown(self) -> None:
        await self.close_stream()
        self.coordinator.close()
        self.pool.shutdown()


def evaluation_config(cfg: RunConfig) -> RunConfig:
    """The run's config turned into held-out evaluation: no gate, no filter, no trajectory stop (a
    stopped trajectory's reward is a prediction, not a measured success), every task once,
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
    update = {"rollout": rollout, "engine": engine, "trajectory_stop": TrajectoryStopConfig()}
    return cfg.model_copy(update=update)


def create_coordinator(
    cfg: RunConfig,
    engines: Sequence[EngineHandle],
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
