"""A game the engine cannot parse: one clear error naming the file, in-process, over Ray and in
the play CLI (the planner's own exceptions must never cross a process boundary)."""

from __future__ import annotations

import asyncio

import pytest

from alfworld_env import GameError
from alfworld_env.engine import Episode
from alfworld_env.play import main as play
from selective_rollout.envs.alfworld import AlfworldSource
from selective_rollout.envs.base import TaskError
from selective_rollout.envs.pool import RayEnvPool
from tests.fixtures.games import alfworld_tasks
from tests.fixtures.output import own_lines


def test_episode_raises_game_error_with_the_parser_message(broken_game):
    with pytest.raises(GameError, match="failed to load: ParseError"):
        Episode(str(broken_game / "game.tw-pddl"))


def test_play_cli_prints_one_line_and_no_traceback(broken_game, capsys):
    assert play([str(broken_game), "--commands", "look"]) == 2
    (err,) = own_lines(capsys.readouterr().err)
    assert "Traceback" not in err
    assert err.startswith(f"error: {broken_game / 'game.tw-pddl'}: ")


@pytest.mark.ray
def test_pool_reports_the_game_file_and_keeps_its_worker(ray_cluster, tiny_games, broken_game, broken_task):
    pool = RayEnvPool(1, AlfworldSource())
    good = alfworld_tasks(tiny_games)[0]

    async def scenario() -> None:
        with pytest.raises(TaskError, match=str(broken_game / "game.tw-pddl")):
            await pool.reset_group(broken_task, 3)
        states = await pool.reset_group(good, 2)  # the same worker still plays good games
        assert all(s.admissible and not s.failed for s in states)
        await pool.close([s.episode_id for s in states])

    try:
        pids = asyncio.run(pool.worker_pids())
        asyncio.run(scenario())
        assert asyncio.run(pool.worker_pids()) == pids
        assert asyncio.run(pool.metrics())["env/episodes_open"] == 0
    finally:
        pool.shutdown()


def test_the_warm_start_names_a_broken_task_in_one_line_and_clones_the_others(
    tiny_games, broken_task, smollm2_tokenizer, caplog
):
    """A truncated PDDL problem among the warm start's games: the run does not stop there (the
    rollout skips the same game); the warm start names it once and clones the rest."""
    from selective_rollout.config import load_config
    from selective_rollout.envs.base import TaskError
    from selective_rollout.rollout.agent import Agent
    from selective_rollout.sft import clone_walkthroughs

    cfg = load_config(
        None, [f"env.games_dir={tiny_games}", "env.preset=tiny", "env.n_train=6", "env.n_valid=2"]
    )
    env = cfg.env.build()
    agent = Agent(cfg.agent, smollm2_tokenizer, env.prompt)
    good = env.tasks("train")[:2]
    with caplog.at_level("WARNING", logger="selective_rollout.sft"):
        data = clone_walkthroughs([good[0], broken_task, good[1]], agent, cfg.rollout.max_steps, env)
    assert {e.task_id for e in data} == {good[0].task_id, good[1].task_id}
    (line,) = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert broken_task.task_id in line and "\n" not in line and "ParseError" in line
    with pytest.raises(TaskError, match="none of the 1 tasks could be played"):
        clone_walkthroughs([broken_task], agent, cfg.rollout.max_steps, env)
