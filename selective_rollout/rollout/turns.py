"""The per-turn machinery every rollout source plays groups with, whatever its schedule.

``Turns`` opens a group's G episodes, makes one engine call for one trajectory (in its KV session,
seeded by the task, not the schedule), steps the environment, applies a step to a trajectory (its
record, its dialogue, the gate's watch) and frees what a group held. ``EngineSlots`` holds the
rollout engines by slot: which are alive, which one a new group uses, and the wait for the
driver's replacement when every one has died. The concurrent coordinator and the lock-step
reference compose the same ``Turns``, so they differ only in how they order its calls.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ray.exceptions import RayActorError, RayTaskError

from selective_rollout.config import RunConfig
from selective_rollout.records import Step, Task, TrajectoryStatus, version_runs
from selective_rollout.rollout.dialogue import GeneratedTurn
from selective_rollout.rollout.engines import SamplingParams
from selective_rollout.rollout.group_run import GroupRun, TrajectoryRun

if TYPE_CHECKING:
    from selective_rollout.envs.base import Environment, EnvPool, EpisodeState
    from selective_rollout.rollout.agent import Agent

log = logging.getLogger(__name__)

WORKER_DIED = (RayActorError, RayTaskError, ConnectionError)

EngineHandle = Any  # a rollout engine's Ray actor handle (``RolloutEngine`` methods, called ``.remote``)


class GroupFailed(RuntimeError):
    """An engine or environment worker died under a group."""


class BadGame(GroupFailed):
    """The task's game cannot be played: never retried, and skipped for the rest of the run."""


class EngineSlots:
    """The rollout engines by slot. A slot whose engine died stays empty until the driver hands a
    fresh engine (``replace``); new groups go round-robin over the live ones."""

    def __init__(self, engines: Sequence[EngineHandle], replace_timeout_s: float) -> None:
        if not engines:
            raise ValueError("the coordinator needs at least one rollout engine")
        self._engines = list(engines)
        self._replace_timeout_s = replace_timeout_s
        self._dead: set[int] = set()
        self._rr = 0
        self._back: asyncio.Event | None = None  # set when a replacement engine arrives

    def __getitem__(self, index: int) -> EngineHandle:
        return self._engines[index]

    def live(self) -> list[int]:
        return [i for i in range(len(self._engines)) if i not in self._dead]

    def pick(self) -> int:
        alive = self.live()
        if not alive:
            raise RuntimeError("every rollout engine has died; the rollout cannot continue")
        self._rr += 1
        return alive[self._rr % len(alive)]

    def died(self, index: int) -> None:
        self._dead.add(index)

    def is_dead(self, index: int) -> bool:
        return index in self._dead

    def dead(self) -> list[int]:
        """Slots whose engine died (the driver replaces them, see ``replace``)."""
        return sorted(self._dead)

    def replace(self, index: int, engine: EngineHandle) -> None:
        """A fresh engine, already holding the current weights, takes over slot ``index``."""
        self._engines[index] = engine
        self._dead.discard(index)
        if self._back is not None:
            self._back.set()

    async def wait_for_replacement(self) -> None:
        """Every engine is dead and groups are still to run: wait for the driver's replacement."""
        timeout = self._replace_timeout_s
        self._back = asyncio.Event()
        log.warning("every rollout engine has died; waiting up to %.0f s for a replacement", timeout)
        try:
            await asyncio.wait_for(self._back.wait(), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"every rollout engine has died and none was replaced within {timeout:.0f} s "
                "(rollout.engine_replace_timeout_s)"
            ) from None
        finally:
            self._back = None


class Turns:
    """Plays the turns of groups over the engines in ``slots`` and the environment's ``pool``;
    ``environment`` gives the reward rule and says which errors mean an unplayable game. Counts
    the tokens it generated and the env steps it took (the driver's liveness probe reads them)."""

    def __init__(
        self, cfg: RunConfig, slots: EngineSlots, pool: EnvPool, environment: Environment, agent: Agent
    ) -> None:
        self.cfg, self.rc = cfg, cfg.rollout
        self.slots = slots
        self.pool = pool
        self.environment = environment
        self.agent = agent
        self.tokens = 0
        self.env_steps = 0

    async def open(self, task: Task, group: GroupRun) -> None:
        """Reset the group's G episodes and start each trajectory's dialogue."""
        try:
            states = await self.pool.reset_group(task, self.rc.group_size)
        except self.environment.game_errors() as exc:
            raise BadGame(f"task {task.task_id}: bad game {exc}") from None
        except WORKER_DIED as exc:
            raise GroupFailed(f"env worker died while opening {task.task_id}: {exc}") from exc
        for i, st in enumerate(states):
            if st.failed:
                raise GroupFailed(f"env worker failed opening {task.task_id}: {st.failed}")
            # the environment's own first messages, if any; a pool or agent written for text
            # observations alone need not know of them
            messages = getattr(st, "messages", None)
            opening = {"messages": messages} if messages is not None else {}
            conversation = self.agent.start(st.task, st.obs, st.admissible, **opening)
            traj = TrajectoryRun(i, st.episode_id, f"{group.group_id}-t{i}", conversation)
            traj.admissible = st.admissible
            group.trajectories.append(traj)

    async def generate(
        self, group: GroupRun, traj: TrajectoryRun, engine: EngineHandle
    ) -> GeneratedTurn | None:
        """One call of ``engine`` (the group's, taken when it started) for one trajectory, in its
        KV session: its reply parsed into a command; None when the request was aborted because
        the group was cut. An abort nobody asked for (the engine dropped the request) fails the
        group, since its trajectory has no next step."""
        sampling = self._sampling(group, traj)
        request_id = traj.request_id = f"{traj.session_id}-s{len(traj.steps)}"
        prompt = traj.conversation.prompt_ids
        try:
            completion = await engine.generate.remote(request_id, prompt, sampling, traj.session_id)
        except (RayActorError, ConnectionError) as exc:  # the actor is gone: replaced by the driver
            self.slots.died(group.engine_index)
            raise GroupFailed(f"engine {group.engine_index} died during {request_id}: {exc}") from exc
        except RayTaskError as exc:  # the request failed; the engine lives on
            raise GroupFailed(f"engine {group.engine_index} failed {request_id}: {exc}") from exc
        except asyncio.CancelledError:
            # cancelled from outside (a closed stream, a shutdown): a Ray call is not cancelled
            # with its caller, and the engine would decode the request to its end beside
            # whatever it serves next (the final evaluation's greedy episodes)
            if traj.request_id is not None:  # not yet aborted with its group (``abort``)
                await self._abort(group, [request_id])
            raise
        finally:
            traj.request_id = None
        out = completion.outputs[0]
        if out.finish_reason == "abort":
            if group.life.stopped:
                return None
            raise GroupFailed(f"engine {group.engine_index} aborted {request_id} unasked")
        parsed = self.agent.parse(out.text, traj.admissible)
        self.tokens += len(out.token_ids)
        return GeneratedTurn(
            command=parsed.command,
            valid=parsed.valid,
            text=out.text,
            token_ids=tuple(out.token_ids),
            logprobs=tuple(out.logprobs),
            prompt_tokens=completion.prompt_tokens,
            versions=tuple(out.versions),
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
                stop=self.environment.stop_strings() or None,
            ),
        )

    async def step(self, group: GroupRun, actions: dict[str, str]) -> dict[str, EpisodeState]:
        """One environment step of the group's episodes named in ``actions`` (episode id -> command)."""
        try:
            states = await self.pool.step(actions)
        except WORKER_DIED as exc:
            raise GroupFailed(f"env worker died stepping {group.group_id}: {exc}") from exc
        for st in states.values():
            if st.failed:
                raise GroupFailed(f"env episode {st.episode_id} of {group.group_id} failed: {st.failed}")
        self.env_steps += len(actions)
        return states

    def apply(self, group: GroupRun, traj: TrajectoryRun, turn: GeneratedTurn, state: EpisodeState) -> None:
        """Record one step of one trajectory and extend its dialogue for the next turn."""
        traj.steps.append(
            Step(
                action=turn.command,
                valid=turn.valid,
                prompt_tokens=turn.prompt_tokens,
                completion_tokens=len(turn.token_ids),
                reward=float(state.reward),
                done=bool(state.done),
                version_runs=version_runs(turn.versions, group.policy_version),
            )
        )
        traj.conversation.add_completion(turn.token_ids, turn.text, turn.logprobs, turn.versions)
        traj.won = bool(state.won)
        if state.done or state.won:
            traj.status = TrajectoryStatus.FINISHED
        elif len(traj.steps) >= self.rc.max_steps:
            traj.status = TrajectoryStatus.TRUNCATED
        if not traj.live:
            traj.reward = self.environment.trajectory_reward([s.reward for s in traj.steps], state)
        else:
            traj.admissible = state.admissible
            traj.conversation.extend(state.obs, state.admissible, getattr(state, "messages", None))
        group.after_step(traj)

    async def abort(self, group: GroupRun) -> None:
        """Abort the group's requests in flight (it was cut, failed or cancelled from outside)."""
        in_flight = [t.request_id for t in group.trajectories if t.request_id]
        for traj in group.trajectories:
            traj.request_id = None  # aborted: a cancelled ``generate`` need not abort it again
        await self._abort(group, in_flight)

    async def _abort(self, group: GroupRun, request_ids: list[str]) -> None:
        if not request_ids or self.slots.is_dead(group.engine_index):
            return
        try:
            await self.slots[group.engine_index].abort.remote(request_ids)
        except WORKER_DIED:
            log.warning("engine %d died while aborting %s", group.engine_index, group.group_id)

    async def close(self, group: GroupRun) -> None:
        """Free the group's episodes and KV sessions (also after a failure)."""
        episodes = [t.episode_id for t in group.trajectories]
        sessions = [t.session_id for t in group.trajectories]
        try:
            if episodes:
                await self.pool.close(episodes)
            if sessions and not self.slots.is_dead(group.engine_index):
                await self.slots[group.engine_index].release.remote(sessions)
        except WORKER_DIED as exc:
            log.warning("could not free the resources of %s: %s", group.group_id, exc)
