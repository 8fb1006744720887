"""A game the engine cannot parse: one clear error naming the file, in-process, over Ray and in
the play CLI (the planner's own exceptions must never cross a process boundary)."""

from __future__ import annotations

import asyncio

import pytest

from alfworld_env import EnvPool, GameError, load_games
from alfworld_env.engine import Episode
from alfworld_env.play import main as play


def test_episode_raises_game_error_with_the_parser_message(broken_game):
    with pytest.raises(GameError, match="failed to load: ParseError"):
        Episode(str(broken_game / "game.tw-pddl"))


def test_play_cli_prints_one_line_and_no_traceback(broken_game, capsys):
    assert play([str(broken_game), "--commands", "look"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith(f"error: {broken_game / 'game.tw-pddl'}: ")


@pytest.mark.ray
def test_pool_reports_the_game_file_and_keeps_its_worker(ray_cluster, tiny_games, broken_game):
    pool = EnvPool(num_workers=1)
    good = load_games(tiny_games, "train")[0].game_dir

    async def scenario() -> None:
        with pytest.raises(GameError, match=str(broken_game / "game.tw-pddl")):
            await pool.reset_group(str(broken_game), 3)
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
