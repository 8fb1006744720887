"""Generated games: every task type, solvable by our solver, winning only on the last step."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest

from alfworld_env import TASK_TYPES, load_games
from alfworld_env.engine import NOTHING_HAPPENS, Episode
from alfworld_env.generate import generate_game
from alfworld_env.speedups import disable, enable


def _play(game_dir: str, commands: list[str]) -> list:
    ep = Episode(str(Path(game_dir) / "game.tw-pddl"))
    try:
        return [ep.reset()] + [ep.step(c) for c in commands]
    finally:
        ep.close()


def test_every_task_type_wins_only_on_last_step(tiny_games):
    games = load_games(tiny_games, "train")
    assert {g.task_type for g in games} == set(TASK_TYPES)
    for g in games:
        walkthrough = json.loads((Path(g.game_dir) / "game.tw-pddl").read_text())["walkthrough"]
        wins = [ob.won for ob in _play(g.game_dir, walkthrough)]
        assert wins == [False] * len(walkthrough) + [True], g.task_id


def test_skipping_the_clean_does_not_win(tiny_games):
    game = next(g for g in load_games(tiny_games, "train") if g.task_type == "pick_clean_then_place_in_recep")
    walkthrough = json.loads((Path(game.game_dir) / "game.tw-pddl").read_text())["walkthrough"]
    shortcut = [c for c in walkthrough if not c.startswith("clean ")]
    assert len(shortcut) == len(walkthrough) - 1
    assert not any(ob.won for ob in _play(game.game_dir, shortcut))


def test_invalid_command_gives_nothing_happens(tiny_games):
    game = load_games(tiny_games, "train")[0]
    obs = _play(game.game_dir, ["fly to the moon"])
    assert obs[1].obs == NOTHING_HAPPENS and not obs[1].won


def test_copies_of_one_game_are_independent(tiny_games):
    game_file = str(Path(load_games(tiny_games, "train")[0].game_dir) / "game.tw-pddl")
    a, b = Episode(game_file), Episode(game_file)
    first = a.reset()
    assert b.reset().obs == first.obs
    go = [c for c in first.admissible if c.startswith("go to ")]
    oa, ob = a.step(go[0]), b.step(go[1])
    assert oa.obs != ob.obs
    assert a.step("look").obs != b.step("look").obs


def test_parse_cache_gives_identical_observations(tiny_games):
    def trace(cached: bool) -> list:
        enable(parse_cache=cached, translation_cache=cached)
        rng, out = random.Random(3), []
        for g in load_games(tiny_games, "train")[:3]:
            ep = Episode(str(Path(g.game_dir) / "game.tw-pddl"))
            ob = ep.reset()
            out.append((ob.obs, ob.admissible))
            for _ in range(8):
                ob = ep.step(rng.choice(ob.admissible))
                out.append((ob.obs, ob.admissible, ob.won))
        return out

    try:
        assert trace(False) == trace(True)
    finally:
        disable()


def test_generation_is_deterministic_and_splits_are_disjoint(tiny_games, tmp_path):
    again = generate_game(tmp_path, "train", 0, seed=0, preset="tiny")
    first = Path(load_games(tiny_games, "train")[0].game_dir)
    original = next(p for p in first.parent.parent.glob("*/trial_tiny_s0_00000"))
    assert (again / "game.tw-pddl").read_text() == (original / "game.tw-pddl").read_text()
    rooms = {
        split: {
            json.loads((Path(g.game_dir) / "traj_data.json").read_text())["scene"]["scene_num"]
            for g in load_games(tiny_games, split)
        }
        for split in ("train", "valid_unseen")
    }
    assert not rooms["train"] & rooms["valid_unseen"]


def test_official_layout_is_loaded_and_filtered(tiny_games, tmp_path, monkeypatch):
    src = Path(load_games(tiny_games, "valid_seen")[0].game_dir)
    base = tmp_path / "alfworld_data" / "json_2.1.1" / "valid_seen"
    keep = base / "pick_and_place_simple-Pan-None-Fridge-1" / "trial_T2019"
    shutil.copytree(src, keep)
    shutil.copytree(src, base / "pick_and_place_with_movable_recep-Pan-Bowl-Fridge-1" / "trial_T1")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld_data"))
    games = load_games("unused", "valid_seen", source="official")
    assert [g.game_dir for g in games] == [str(keep)]
    assert games[0].task_id == "valid_seen/pick_and_place_simple-Pan-None-Fridge-1/trial_T2019"


def test_missing_folders_name_the_path(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "train")):
        load_games(tmp_path, "train")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape("json_2.1.1")):
        load_games(tmp_path, "train", source="official")
