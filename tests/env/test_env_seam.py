"""An environment added from outside the package: one class, its Params model and the decorator; the
run config selects and validates it, the configuration reference lists it, and the coordinator
plays it (its pool, its prompt and its reward rule) with no change anywhere (DESIGN.md 2.1.1)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import Field

from selective_rollout.config import ConfigError, dump_config, load_config
from selective_rollout.config.reference import render
from selective_rollout.envs import ENVS, Environment, PromptText, register_env
from selective_rollout.envs.base import folder_task
from selective_rollout.envs.game_folders import GameFolderParams, GameFolders
from selective_rollout.records import Outcome, Task
from selective_rollout.rollout.coordinator import GroupCoordinator
from tests.rollout.test_coordinator_unit import GAMES, SCRIPTS, ScriptedAgent, ScriptedEngine, _State

TOY = "toy_test_only"


class ToyGameError(RuntimeError):
    """The toy's own "this game cannot be played"."""


class ToyParams(GameFolderParams):
    win_reward: float = Field(1.0, gt=0.0, description="reward of a won episode")


class ToyPool:
    """In-process episodes: 'win' wins, 'quit' loses; the game 'broken' cannot be opened."""

    def __init__(self) -> None:
        self.open: set[str] = set()
        self.n = 0

    async def reset_group(self, task: Task, g: int) -> list[_State]:
        game_dir = task.payload["game_dir"]
        if game_dir == "broken":
            raise ToyGameError(f"{game_dir}: unreadable")
        ids = [f"{game_dir}:{self.n + i}" for i in range(g)]
        self.n += g
        self.open.update(ids)
        return [_State(eid, task=game_dir) for eid in ids]  # the scripted agent reads the script here

    async def step(self, actions: dict[str, str]) -> dict[str, _State]:
        return {eid: _State(eid, won=a == "win", done=a in ("win", "quit")) for eid, a in actions.items()}

    async def close(self, episode_ids) -> None:
        self.open.difference_update(episode_ids)


class Toy(GameFolders, Environment):
    """A toy environment for the seam's tests (in-process episodes, a scaled reward), with the
    game-folder capability (its games root defaults to its own folder)."""

    Params = ToyParams
    params: ToyParams
    prompt = PromptText(world="a toy game", commands="win, quit")

    def default_games_dir(self) -> str:
        return "toy-games"

    def tasks(self, split: str) -> list[Task]:
        return [folder_task(g, f"{split}/{g}", "toy") for g in GAMES]

    def pool(self, worker_options=None) -> ToyPool:
        return ToyPool()

    def game_errors(self) -> tuple[type[Exception], ...]:
        return (ToyGameError,)

    def reward(self, final) -> float:
        return self.params.win_reward if final.won else 0.0


@pytest.fixture
def toy_env():
    register_env(TOY)(Toy)
    try:
        yield Toy
    finally:
        ENVS.remove(TOY)


def test_config_selects_the_toy_and_validates_its_own_parameter(toy_env, tmp_path):
    cfg = load_config(None, [f"env.name={TOY}", "env.win_reward=2.5"])
    env = cfg.env.build()
    assert isinstance(env, Toy) and env.params.win_reward == 2.5 and cfg.env.win_reward == 2.5
    assert str(env.games_dir) == "toy-games"  # env.games_dir unset: the environment's own folder
    assert load_config(None, [f"env.name={TOY}"]).env.win_reward == 1.0  # its own default is filled in
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"env.name={TOY}", "env.preset=tiny"], rf"env\.preset: environment '{TOY}' has no such parameter"),
        (
            ["env.win_reward=2"],
            rf"env\.win_reward: environment 'alfworld' has no such parameter \({TOY} has\)",
        ),
        ([f"env.name={TOY}", "env.win_reward=0"], r"env\.win_reward must be > 0(\.0)? \(got 0\)"),
        (["env.name=nope"], rf"env\.name: unknown environment 'nope'; known: .*{TOY}"),
        (["env.level_typo=1"], r"env\.level_typo: unknown key"),
    ],
)
def test_bad_environment_keys_are_one_line_naming_the_key(toy_env, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_reference_lists_the_toy_and_its_parameter(toy_env):
    text = render()
    assert f"### `env.name: {TOY}`" in text and "`env.win_reward`" in text


def test_the_shipped_environments_are_registered():
    assert {"alfworld", "tw-cooking"} <= set(ENVS)
    assert load_config(None).env.name == "alfworld"  # the default profile is unchanged


def _coordinator(overrides: list[str]) -> tuple[GroupCoordinator, ToyPool]:
    base = [f"env.name={TOY}", "rollout.group_size=4", "gate.k=3", "gate.tau=0.12", "rollout.audit_budget=0"]
    cfg = load_config(None, [*base, *overrides])
    env = cfg.env.build()
    pool = env.pool()
    coordinator = GroupCoordinator(cfg, [ScriptedEngine(SCRIPTS)], pool, ScriptedAgent())
    return coordinator, pool


def test_the_coordinator_plays_the_toy_with_its_reward_rule(toy_env):
    coordinator, pool = _coordinator(
        ["env.win_reward=3", "rollout.strategy=none", "rollout.groups_per_iteration=1"]
    )
    tasks = [folder_task("diverge_mixed", "train/diverge_mixed", "toy")]
    batch = asyncio.run(coordinator.rollout(tasks))
    (record,) = batch.groups
    assert record.outcome is Outcome.COMPLETED
    assert [t.reward for t in record.trajectories] == [3.0, 0.0, 3.0, 0.0]  # the toy's rule, not float(won)
    assert {e.reward for e in batch.experiences} == {0.0, 3.0}
    assert pool.open == set()  # every episode closed through the toy's pool


def test_the_toy_s_game_errors_mark_a_bad_game(toy_env):
    coordinator, _ = _coordinator(["rollout.strategy=none", "rollout.groups_per_iteration=1"])
    tasks = [
        folder_task("broken", "train/broken", "toy"),
        folder_task("converge_win", "train/converge_win", "toy"),
    ]
    batch = asyncio.run(coordinator.rollout(tasks))
    assert [r.outcome for r in batch.groups] == [Outcome.FAILED, Outcome.COMPLETED]
    assert "bad game" in batch.groups[0].meta["failure"]
