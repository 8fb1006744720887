"""The env pool over the real Ray cluster: groups, concurrent steps, close, and a killed worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from selective_rollout.envs.alfworld import AlfworldSource
from selective_rollout.envs.base import game_dir
from selective_rollout.envs.pool import RayEnvPool
from tests.fixtures.games import alfworld_tasks

pytestmark = pytest.mark.ray


def _walkthrough(task) -> list[str]:
    return json.loads((game_dir(task) / "game.tw-pddl").read_text())["walkthrough"]


def test_pool_plays_groups_and_survives_a_killed_worker(ray_cluster, tiny_games):
    games = alfworld_tasks(tiny_games)
    pool = RayEnvPool(2, AlfworldSource())

    async def scenario() -> None:
        a = await pool.reset_group(games[0], 3)
        b = await pool.reset_group(games[1], 2)
        assert len({s.episode_id for s in a + b}) == 5
        assert all(s.task and s.admissible and not s.done for s in a + b)

        # The walkthrough wins for one copy; the others, given other commands, do not.
        plan = _walkthrough(games[0])
        winner, others = a[0].episode_id, [s.episode_id for s in a[1:]]
        for i, cmd in enumerate(plan):
            out = await pool.step({winner: cmd, **dict.fromkeys(others, "look")})
            assert out[winner].won == out[winner].done == (i == len(plan) - 1)
            assert out[winner].reward == (1.0 if i == len(plan) - 1 else 0.0)
            assert not any(out[e].won for e in others)
        await pool.close([s.episode_id for s in a])

        # Kill the worker that hosts group b mid-episode.
        victim_pids = set(await pool.worker_pids())
        await pool.step({s.episode_id: "look" for s in b})
        hosting = pool._where[b[0].episode_id]
        os.kill((await pool.worker_pids())[hosting], signal.SIGKILL)
        time.sleep(1.0)
        out = await pool.step({s.episode_id: "look" for s in b})
        assert all(out[s.episode_id].failed and out[s.episode_id].done for s in b)
        assert "died" in out[b[0].episode_id].failed

        # New groups still open and play, on live (or replaced) workers.
        c = await pool.reset_group(games[2], 2)
        out = await pool.step({s.episode_id: "look" for s in c})
        assert all(o.failed is None and o.obs for o in out.values())
        assert set(await pool.worker_pids()) != victim_pids
        await pool.close([s.episode_id for s in c])

    try:
        asyncio.run(scenario())
        m = asyncio.run(pool.metrics())
        assert m["env/restarts"] == 1.0 and m["env/steps"] > 0 and m["env/episodes_open"] == 0.0
    finally:
        pool.shutdown()


def test_two_workers_killed_at_once_are_replaced_once_each(ray_cluster, tiny_games):
    games = alfworld_tasks(tiny_games)
    pool = RayEnvPool(2, AlfworldSource())

    async def scenario() -> None:
        a = await pool.reset_group(games[0], 4)
        b = await pool.reset_group(games[1], 4)
        assert pool._where[a[0].episode_id] != pool._where[b[0].episode_id]
        for pid in await pool.worker_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        # several calls in flight to each dead worker: each failure arrives after the first replaced it
        halves = [a[:2], a[2:], b[:2], b[2:]]
        outs = await asyncio.gather(*(pool.step({s.episode_id: "look" for s in h}) for h in halves))
        assert all(st.failed and st.done for out in outs for st in out.values())
        await pool.close([s.episode_id for s in a + b])
        c = await pool.reset_group(games[2], 2)  # both fresh workers play
        d = await pool.reset_group(games[3], 2)
        assert pool._where[c[0].episode_id] != pool._where[d[0].episode_id]
        out = await pool.step({s.episode_id: "look" for s in c + d})
        assert all(st.failed is None for st in out.values())
        await pool.close([s.episode_id for s in c + d])

    try:
        asyncio.run(scenario())
        assert asyncio.run(pool.metrics())["env/restarts"] == 2.0
    finally:
        pool.shutdown()
