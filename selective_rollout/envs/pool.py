"""The env pool: many episodes served by a few Ray worker actors, for any environment.

A group (G episodes of one task) lives on one worker, so what the task shares (a game file, its
logic and translation) is loaded once for all G copies. A worker that dies is replaced by a fresh
actor; every episode it hosted is reported once with ``failed`` set (never silently dropped) and
new groups go to live workers. The environment's ``EpisodeSource`` says how a worker opens
episodes of a task, so every environment reuses the actors, the worker replacement and the
batching.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from selective_rollout.envs.episode import (
    Episode,
    EpisodeSource,
    EpisodeState,
    Message,
    Observation,
    TaskError,
    as_task_error,
    messages_of,
    step_reward,
)
from selective_rollout.records import Task

LOST = "its env worker died; episode lost"


# what a worker sends back per episode: (obs, admissible, won, done, task, reward, messages); plain data
_Result = tuple[str, list[str], bool, bool, str, float, list[Message] | None]


@dataclass
class _WorkerStats:
    steps: int = 0
    step_s: float = 0.0
    resets: int = 0
    reset_s: float = 0.0


class EnvWorker:
    """Hosts episodes in one process (a Ray actor); see ``EnvPool`` for the contract."""

    def __init__(self, source: EpisodeSource) -> None:
        source.prepare()
        self._source = source
        self._episodes: dict[str, Episode] = {}
        self._stats = _WorkerStats()

    def location(self) -> dict[str, object]:
        """Which Ray node and process host this worker (for placement checks on a cluster)."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def reset_group(self, task: Task, episode_ids: list[str]) -> list[_Result] | str:
        """G fresh episodes of one task, or why the task is unplayable.

        The failure comes back as a string, not an exception: it must cross to the caller's
        process as plain data (see ``TaskError``).
        """
        start = time.perf_counter()
        try:
            out = []
            for eid, ep in zip(episode_ids, self._source.open(task, len(episode_ids)), strict=True):
                with as_task_error("reset", self._source.errors):
                    ob = ep.reset()
                self._episodes[eid] = ep
                out.append(_result(ob, self._source.task_sentence(ob)))
        except (OSError, ValueError, TaskError, *self._source.errors) as exc:
            for eid in episode_ids:
                self._episodes.pop(eid, None)
            return f"{self._source.describe(task)}: {exc}"
        self._stats.resets += 1
        self._stats.reset_s += time.perf_counter() - start
        return out

    def step(self, actions: dict[str, str]) -> dict[str, _Result | str]:
        """Per episode: its observation, or an error string (an unknown episode, an engine error)."""
        out: dict[str, _Result | str] = {}
        for eid, command in actions.items():
            ep = self._episodes.get(eid)
            if ep is None:
                out[eid] = f"episode {eid} is not open on this env worker"
                continue
            start = time.perf_counter()
            try:
                with as_task_error(f"step {command!r}", self._source.errors):
                    ob = ep.step(command)
            except TaskError as exc:
                out[eid] = str(exc)
                continue
            self._stats.step_s += time.perf_counter() - start
            self._stats.steps += 1
            out[eid] = _result(ob, "")
        return out

    def close(self, episode_ids: list[str]) -> None:
        for eid in episode_ids:
            ep = self._episodes.pop(eid, None)
            if ep is not None:
                ep.close()

    def stats(self) -> dict[str, float]:
        return {**self._stats.__dict__, "open": len(self._episodes)}


def _result(ob: Observation, task: str) -> _Result:
    return (ob.obs, list(ob.admissible), bool(ob.won), bool(ob.done), task, step_reward(ob), messages_of(ob))


@dataclass
class _Slot:
    actor: object
    episodes: set[str] = field(default_factory=set)


class RayEnvPool:
    """Handle over ``num_workers`` EnvWorker actors; call from the driver or inside an actor.

    ``source`` says how the workers open episodes of the environment's tasks."""

    def __init__(
        self, num_workers: int, source: EpisodeSource, worker_options: dict[str, Any] | None = None
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"EnvPool needs at least one worker, got num_workers={num_workers}")
        if not ray.is_initialized():
            raise RuntimeError("EnvPool needs Ray: call ray.init() (or run inside a Ray actor) first")
        self._options = {"num_cpus": 1, **(worker_options or {})}
        self._source = source
        self._slots = [_Slot(self._spawn()) for _ in range(num_workers)]
        self._where: dict[str, int] = {}
        self._failed: dict[str, str] = {}
        self._ids = itertools.count()
        self._restarts = 0
        self._reset_s: list[float] = []

    def _spawn(self):
        return ray.remote(EnvWorker).options(**self._options).remote(self._source)

    async def worker_locations(self) -> list[dict[str, object]]:
        """Node and PID of every worker (awaited: a blocking ``ray.get`` would stall the event
        loop of the async actor that owns the pool)."""
        return list(await asyncio.gather(*(s.actor.location.remote() for s in self._slots)))

    async def worker_pids(self) -> list[int]:
        return [int(loc["pid"]) for loc in await self.worker_locations()]

    def _replace(self, index: int, dead: object, reason: str) -> None:
        """Worker ``dead`` died: mark its episodes failed and put a fresh worker in its slot.

        Several calls to one dead worker fail; only the first replaces it (a later failure of
        a call made to the old worker must not kill the fresh one).
        """
        slot = self._slots[index]
        if slot.actor is not dead:
            return
        for eid in slot.episodes:
            self._failed[eid] = f"env worker {index} died ({reason}); episode lost"
            self._where.pop(eid, None)
        ray.kill(slot.actor, no_restart=True)
        self._slots[index] = _Slot(self._spawn())
        self._restarts += 1

    async def reset_group(self, task: Task, g: int) -> list[EpisodeState]:
        """G independent episodes of one task on the least loaded worker.

        Raises ``TaskError`` (naming what the source says the task is) when the task cannot be
        played, and ``RuntimeError`` when every worker died trying.
        """
        ids = [f"ep{next(self._ids)}" for _ in range(g)]
        for _attempt in range(len(self._slots) + 1):
            index = min(range(len(self._slots)), key=lambda i: len(self._slots[i].episodes))
            slot = self._slots[index]
            actor, start = slot.actor, time.perf_counter()
            try:
                results = await actor.reset_group.remote(task, ids)
            except RayActorError as exc:
                self._replace(index, actor, type(exc).__name__)
                continue
            if isinstance(results, str):
                raise TaskError(results)
            self._reset_s.append(time.perf_counter() - start)
            slot.episodes.update(ids)
            self._where.update(dict.fromkeys(ids, index))
            return [self._state(eid, r) for eid, r in zip(ids, results, strict=True)]
        raise RuntimeError(f"could not open {g} episodes of {task.task_id}: every env worker died")

    @staticmethod
    def _state(eid: str, result: _Result) -> EpisodeState:
        obs, admissible, won, done, task, reward, messages = result
        return EpisodeState(eid, obs, admissible, reward, done, won, task, messages=messages)

    async def step(self, actions: dict[str, str]) -> dict[str, EpisodeState]:
        """Step many episodes at once; each worker gets one call for all its episodes."""
        out: dict[str, EpisodeState] = {}
        by_worker: dict[int, dict[str, str]] = {}
        for eid, command in actions.items():
            if eid in self._failed:
                out[eid] = EpisodeState(eid, "", [], done=True, failed=self._failed.pop(eid, LOST))
            elif eid not in self._where:
                raise KeyError(f"unknown or closed episode {eid!r}")
            else:
                by_worker.setdefault(self._where[eid], {})[eid] = command
        results = await self._call_workers("step", by_worker)
        for index, result in results.items():
            if isinstance(result, RayActorError):
                for eid in by_worker[index]:
                    out[eid] = EpisodeState(eid, "", [], done=True, failed=self._failed.pop(eid, LOST))
                continue
            if isinstance(result, BaseException):
                raise result
            for eid, r in result.items():
                if isinstance(r, str):
                    out[eid] = EpisodeState(eid, "", [], done=True, failed=r)
                else:
                    out[eid] = self._state(eid, r)
        return out

    async def close(self, episode_ids: Iterable[str]) -> None:
        by_worker: dict[int, list[str]] = {}
        for eid in episode_ids:
            self._failed.pop(eid, None)
            index = self._where.pop(eid, None)
            if index is not None:
                self._slots[index].episodes.discard(eid)
                by_worker.setdefault(index, []).append(eid)
        await self._call_workers("close", by_worker)

    async def _call_workers(self, method: str, work: dict[int, Any]) -> dict[int, Any]:
        """``method`` on every worker of ``work`` with its share, all at once. A worker found dead
        is replaced; its result is the ``RayActorError`` (the caller reports its episodes)."""
        actors = {i: self._slots[i].actor for i in work}
        calls = [getattr(actors[i], method).remote(share) for i, share in work.items()]
        results = dict(zip(work, await asyncio.gather(*calls, return_exceptions=True), strict=True))
        for index, result in results.items():
            if isinstance(result, RayActorError):
                self._replace(index, actors[index], type(result).__name__)
        return results

    async def metrics(self) -> dict[str, float]:
        """Step and reset counts and times over the live workers (a dead one is skipped)."""
        stats = []
        for s in self._slots:
            try:
                stats.append(await asyncio.wait_for(s.actor.stats.remote(), timeout=30))
            except RayActorError:
                continue
        steps = sum(s["steps"] for s in stats)
        step_s = sum(s["step_s"] for s in stats)
        return {
            # the workers' own time in step and reset: over wall-clock x workers, the env busy share
            "env/busy_s": step_s + sum(s["reset_s"] for s in stats),
            "env/workers": float(len(stats)),
            "env/steps": float(steps),
            "env/step_s_mean": step_s / steps if steps else 0.0,
            "env/reset_s_mean": sum(self._reset_s) / len(self._reset_s) if self._reset_s else 0.0,
            "env/resets": float(len(self._reset_s)),
            "env/episodes_open": float(len(self._where)),
            "env/restarts": float(self._restarts),
        }

    def shutdown(self) -> None:
        for s in self._slots:
            ray.kill(s.actor, no_restart=True)
        self._slots = []
        self._where.clear()
