"""Which generated games a run uses: exactly the configured set, generated only where allowed."""

from __future__ import annotations

import pytest

from selective_rollout.config import load_config
from selective_rollout.envs.base import game_dir
from selective_rollout.runtime import held_out_tasks, train_tasks


def test_a_folder_with_more_games_gives_exactly_the_configured_set(tiny_games):
    cfg = load_config(
        None, [f"env.games_dir={tiny_games}", "env.n_train=4", "env.n_valid=2", "eval.num_tasks=2"]
    )
    tasks = train_tasks(cfg)
    assert len(tasks) == 4  # the folder holds 6
    assert all(str(game_dir(t)).endswith(tuple(f"_{i:05d}" for i in range(4))) for t in tasks)
    assert len(held_out_tasks(cfg)) == 2


def test_a_mistyped_games_dir_is_not_silently_filled_with_new_games(tmp_path):
    typo = tmp_path / "data" / "gmaes"
    cfg = load_config(None, [f"env.games_dir={typo}", "env.n_train=2", "env.n_valid=1"])
    with pytest.raises(FileNotFoundError, match=r"no generated games at .*gmaes/train"):
        train_tasks(cfg)
    assert not typo.exists()


def test_too_few_games_for_the_config_name_the_fix(tiny_games):
    cfg = load_config(None, [f"env.games_dir={tiny_games}", "env.n_train=9"])
    with pytest.raises(FileNotFoundError, match=r"holds 6 of the 9 tiny games .*env\.generate=true"):
        train_tasks(cfg)


def test_env_generate_makes_the_set_in_any_folder(tmp_path):
    out = tmp_path / "mine"
    cfg = load_config(None, [f"env.games_dir={out}", "env.generate=true", "env.n_train=2", "env.n_valid=1"])
    assert len(train_tasks(cfg)) == 2 and (out / "valid_unseen").is_dir()


def test_a_mixed_set_deals_every_task_type_in_both_presets(tmp_path):
    from collections import Counter

    out = tmp_path / "mix"
    cfg = load_config(
        None,
        [
            f"env.games_dir={out}",
            "env.generate=true",
            "env.preset=tiny+small",
            "env.n_train=12",
            "env.n_valid=1",
        ],
    )
    tasks = train_tasks(cfg)
    presets = Counter((t.task_type, game_dir(t).name.split("_")[1]) for t in tasks)
    assert len(tasks) == 12 and set(presets.values()) == {1}  # 6 task types x {tiny, small}
    assert {preset for _, preset in presets} == {"tiny", "small"}


def test_the_warm_start_clones_every_task_type(tiny_games):
    """Taking the first N games in folder-name order cloned the alphabetically first types only."""
    from alfworld_env import TASK_TYPES
    from selective_rollout.sft import warm_start_games

    cfg = load_config(
        None, [f"env.games_dir={tiny_games}", "env.n_train=6", "env.n_valid=2", "warm_start.games=6"]
    )
    assert [g.task_type for g in warm_start_games(cfg, tiny_games)] == list(TASK_TYPES)
    assert [t.task_type for t in train_tasks(cfg)] == list(TASK_TYPES)  # generation order
