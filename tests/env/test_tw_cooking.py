"""TextWorld Cooking on real tw-cooking games: generation by textworld's own generator, episodes
on the real TextWorld engine, the reward rule, the task source and the Ray pool."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from selective_rollout.config import load_config
from selective_rollout.envs.base import folder_task, game_dir
from selective_rollout.envs.tw_cooking.engine import GAME_FILE, CookingEpisode
from selective_rollout.envs.tw_cooking.games import LEVELS, META, generate_game, load_tasks, walkthrough

OBJECTIVE = "You are hungry! Let's cook a delicious meal."


def _env(root: Path, *extra: str):
    overrides = [
        "env.name=tw-cooking",
        "env.level=easy",
        f"env.games_dir={root}",
        "env.n_train=3",
        "env.n_valid=1",
    ]
    return load_config(None, [*overrides, *extra]).env.build()


def test_generated_games_hold_a_compiled_game_and_a_verified_walkthrough(cooking_games):
    tasks = load_tasks(cooking_games, "train", "easy", 0, 3)
    assert [t.task_type for t in tasks] == ["tw-cooking-easy"] * 3
    for t in tasks:
        folder = game_dir(t)
        assert (folder / GAME_FILE).is_file() and (folder / "game.json").is_file()
        meta = json.loads((folder / META).read_text())
        assert meta["level"] == "easy" and meta["walkthrough"][-2:] == ["prepare meal", "eat meal"]
        assert 5 <= len(meta["walkthrough"]) <= 12


def test_generation_is_deterministic_and_idempotent(cooking_games, tmp_path):
    first = game_dir(load_tasks(cooking_games, "train", "easy", 0, 1)[0])
    again = generate_game(tmp_path, "train", 0, 0, "easy")
    assert walkthrough(again) == walkthrough(first)  # game i depends only on (seed, split, level, i)
    stamp = (again / GAME_FILE).stat().st_mtime_ns
    assert generate_game(tmp_path, "train", 0, 0, "easy") == again
    assert (again / GAME_FILE).stat().st_mtime_ns == stamp  # kept, not regenerated


def test_held_out_splits_use_other_foods(cooking_games):
    """tw-cooking deals foods into disjoint sets: valid_unseen recipes are made of test foods."""
    train = load_tasks(cooking_games, "train", "easy", 0, 1)[0]
    unseen = load_tasks(cooking_games, "valid_unseen", "easy", 0, 1)[0]
    food = {
        json.loads((game_dir(t) / "game.json").read_text())["metadata"]["ingredients"][0][0]
        for t in (train, unseen)
    }
    assert len(food) == 2


def test_the_walkthrough_wins_on_the_real_engine_with_reward_one(cooking_games):
    env = _env(cooking_games)
    (task, *_) = env.tasks("train")
    episode = env.episode(task)
    try:
        first = episode.reset()
        assert first.obs.startswith(OBJECTIVE)  # the ASCII-art banner is gone
        assert env.task_of(first).startswith(OBJECTIVE) and "examine cookbook" in first.admissible
        plan = env.walkthrough(task)
        assert plan[0] in first.admissible
        for i, command in enumerate(plan):
            ob = episode.step(command)
            assert ob.won == ob.done == (i == len(plan) - 1)
    finally:
        episode.close()
    assert ob.won and not ob.lost


def test_eating_an_ingredient_loses_the_episode_with_reward_zero(cooking_games):
    env = _env(cooking_games)
    task = env.tasks("train")[0]
    episode = CookingEpisode(game_dir(task) / GAME_FILE)
    try:
        ob = episode.reset()
        for command in env.walkthrough(task):
            ob = episode.step(command)
            if command.startswith("take") and "knife" not in command:
                break
        eat = next(a for a in ob.admissible if a.startswith("eat "))
        ob = episode.step(eat)
    finally:
        episode.close()
    assert ob.lost and ob.done and not ob.won
    from selective_rollout.envs.base import EpisodeState

    assert env.reward(EpisodeState("e", ob.obs, [], 0.0, ob.done, ob.won)) == 0.0
    assert env.reward(EpisodeState("e", "", [], 1.0, True, True)) == 1.0


def test_a_missing_set_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--level easy --seed 0 with --n-train"):
        _env(tmp_path / "typo").tasks("train")


def test_levels_and_defaults():
    assert set(LEVELS) == {"easy", "medium", "hard"}
    env = load_config(None, ["env.name=tw-cooking"]).env.build()
    assert str(env.games_dir) == "data/games/tw-cooking-medium" and env.cache_key()[-1] == "medium"


@pytest.mark.ray
def test_the_pool_plays_a_group_on_ray_workers(ray_cluster, cooking_games):
    env = _env(cooking_games, "env.num_workers=1")
    task = env.tasks("train")[0]
    plan = env.walkthrough(task)
    pool = env.pool({"num_cpus": 0.5})

    async def play():
        states = await pool.reset_group(task, 3)
        assert all(s.task.startswith(OBJECTIVE) and s.admissible for s in states)
        winner, loser, idle = (s.episode_id for s in states)
        out = {}
        for command in plan:
            out = await pool.step({winner: command, loser: "inventory"})
        await pool.close([winner, loser, idle])
        return out[winner], out[loser]

    try:
        won, other = asyncio.run(play())
        assert won.won and won.done and env.reward(won) == 1.0
        assert not other.done and env.reward(other) == 0.0
        with pytest.raises(env.game_errors(), match=GAME_FILE):
            asyncio.run(
                pool.reset_group(folder_task(str(cooking_games / "nowhere"), "train/nowhere", "x"), 2)
            )
        assert asyncio.run(pool.metrics())["env/steps"] == 2 * len(plan)
    finally:
        pool.shutdown()


def test_the_warm_start_clones_a_cooking_walkthrough_in_the_cooking_prompt(cooking_games, smollm2_tokenizer):
    from selective_rollout.rollout.agent import Agent
    from selective_rollout.sft import expert_dialogue, warm_start_games

    cfg = load_config(
        "configs/cpu_textworld.yaml",
        [
            "env.level=easy",
            f"env.games_dir={cooking_games}",
            "env.n_train=3",
            "env.n_valid=1",
            "warm_start.games=2",
        ],
    )
    env = cfg.env.build()
    games = warm_start_games(cfg, cooking_games)
    assert [g.task_id for g in games] == [t.task_id for t in env.tasks("train")[:2]]
    agent = Agent(cfg.agent, smollm2_tokenizer, env.prompt)
    (sequence,) = expert_dialogue(games[0], agent, cfg.rollout.max_steps, env)
    text = smollm2_tokenizer.decode(sequence.token_ids)
    assert "You are an agent in a text adventure about cooking a meal" in text and "household" not in text
    cloned = smollm2_tokenizer.decode(
        [t for t, m in zip(sequence.token_ids, sequence.loss_mask, strict=True) if m]
    )
    assert "examine cookbook" in cloned and cloned.rstrip().endswith("eat meal<|im_end|>")
    assert sequence.reward == 1.0
