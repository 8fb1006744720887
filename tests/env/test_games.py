"""Generated games: every task type, solvable by our solver, winning only on the last step."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import alfworld.gen.constants as C
import pytest

from alfworld_env import PRESETS, TASK_TYPES, load_games
from alfworld_env.engine import NOTHING_HAPPENS, Episode
from alfworld_env.generate import generate_game
from alfworld_env.problem import game_json, task_text
from alfworld_env.rooms import receptacle_type
from alfworld_env.scenario import sample_scenario
from alfworld_env.solver import Unsolvable, solve
from alfworld_env.speedups import disable, enable


def _play(game_dir: str, commands: list[str]) -> list:
    ep = Episode(str(Path(game_dir) / "game.tw-pddl"))
    try:
        return [ep.reset()] + [ep.step(c) for c in commands]
    finally:
        ep.close()


def _walkthrough(game_dir: str) -> list[str]:
    return json.loads((Path(game_dir) / "game.tw-pddl").read_text())["walkthrough"]


def _needed(task_type: str) -> int:
    return 2 if task_type == "pick_two_obj_and_place" else 1


def test_every_task_type_wins_only_on_last_step(tiny_games):
    games = load_games(tiny_games, "train")
    assert {g.task_type for g in games} == set(TASK_TYPES)
    for g in games:
        walkthrough = _walkthrough(g.game_dir)
        wins = [ob.won for ob in _play(g.game_dir, walkthrough)]
        assert wins == [False] * len(walkthrough) + [True], g.task_id


def test_skipping_the_clean_does_not_win(tiny_games):
    game = next(g for g in load_games(tiny_games, "train") if g.task_type == "pick_clean_then_place_in_recep")
    walkthrough = _walkthrough(game.game_dir)
    shortcut = [c for c in walkthrough if not c.startswith("clean ")]
    assert len(shortcut) == len(walkthrough) - 1
    assert not any(ob.won for ob in _play(game.game_dir, shortcut))


def test_tiny_games_sit_at_one_spot_with_spare_targets(tiny_games):
    """tiny: one walk reaches every receptacle, nothing needs opening, each target is there twice."""
    for g in load_games(tiny_games, "train"):
        walkthrough = _walkthrough(g.game_dir)
        assert 3 <= len(walkthrough) <= 5, g.task_id
        assert [c for c in walkthrough if c.startswith(("go to ", "open "))] == walkthrough[:1], g.task_id
        arrived = _play(g.game_dir, walkthrough[:1])[1]
        assert not any(c.startswith("go to ") for c in arrived.admissible), g.task_id
        target = json.loads((Path(g.game_dir) / "traj_data.json").read_text())["pddl_params"]["object_target"]
        takes = [c for c in arrived.admissible if c.startswith(f"take {target.lower()} ")]
        assert len(takes) == 2 * _needed(g.task_type), g.task_id


def test_uniform_random_policy_often_wins_tiny_games(tiny_games):
    """What tiny is for: a policy that knows nothing wins often enough for GRPO to learn from."""
    rng, wins, episodes = random.Random(0), 0, 0
    enable()
    try:
        for g in load_games(tiny_games, "train"):
            for _ in range(3):
                ep = Episode(str(Path(g.game_dir) / "game.tw-pddl"))
                ob = ep.reset()
                for _ in range(15):
                    ob = ep.step(rng.choice(ob.admissible))
                    if ob.won:
                        wins += 1
                        break
                ep.close()
                episodes += 1
    finally:
        disable()
    assert wins >= episodes // 5, f"{wins} wins in {episodes} episodes"


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_only_tiny_is_compact(task_type):
    small = sample_scenario(task_type, False, PRESETS["small"], random.Random(task_type))
    assert len({small.location_of(r) for r in small.receptacles}) == len(small.receptacles)
    assert len(small.objects_of(small.object_target)) == _needed(task_type)
    tiny = sample_scenario(task_type, False, PRESETS["tiny"], random.Random(task_type))
    assert {tiny.location_of(r) for r in tiny.receptacles} == {1}
    copies = tiny.objects_of(tiny.object_target)
    assert len(copies) == 2 * _needed(task_type)
    assert len({tiny.placement[o] for o in copies}) == 1
    assert receptacle_type(tiny.placement[copies[0]]) not in C.OPENABLE_CLASS_SET
    assert tiny.parent_target not in C.OPENABLE_CLASS_SET


def test_solver_rejects_a_plan_with_an_inadmissible_command():
    scn = sample_scenario("pick_and_place_simple", False, PRESETS["tiny"], random.Random(0))
    scn.task_text = task_text(scn, random.Random(0))
    game = game_json(scn, "rejected", walkthrough=[])
    scn.one_spot = False  # the plan now walks to the goal, though the agent already stands there
    with pytest.raises(Unsolvable, match="not admissible"):
        solve(scn, game)


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
    # a takes something; b, at the same spot, still sees it and holds nothing.
    take = next(c for c in oa.admissible if c.startswith("take "))
    taken = take.removeprefix("take ").split(" from ")[0]
    assert a.step(take).obs.startswith(f"You pick up the {taken}")
    assert taken in a.step("inventory").obs
    assert b.step("inventory").obs == "You are not carrying anything."
    assert take in b.step("look").admissible


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
    monkeypatch.setenv("ALFWORLD_DATA", "/elsewhere")  # as importing alfworld does: must not matter
    games = load_games(tmp_path / "alfworld_data", "valid_seen", source="official")
    assert [g.game_dir for g in games] == [str(keep)]
    assert games[0].task_id == "valid_seen/pick_and_place_simple-Pan-None-Fridge-1/trial_T2019"


def test_missing_folders_name_the_path(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "train")):
        load_games(tmp_path, "train")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape("json_2.1.1")):
        load_games(tmp_path, "train", source="official")
