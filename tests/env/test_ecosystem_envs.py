"""The adapters for environments written for other libraries, in process: skyrl-gym rows (splits
by file or by ``extra_info.split``, JSONL and parquet, an instance per episode made from its row,
the environment's own first messages, per-step rewards summed, "won") and a gymnasium text
environment by its id (tasks from seeds, the commands ``info`` lists, truncation never wins); the
env worker carries their rewards and messages; a wrong split or a missing key is one line."""

from __future__ import annotations

import asyncio
import json

import pytest

from selective_rollout.config import ConfigError, load_config
from selective_rollout.envs.base import EpisodeState, TaskError
from selective_rollout.envs.pool import EnvWorker, RayEnvPool
from tests.env import gym_doors_env, skyrl_turns_env

SKYRL = ["env.name=skyrl_gym", f"env.imports=[{skyrl_turns_env.__name__}]"]
GYM = ["env.name=gymnasium", f"env.id={gym_doors_env.ENV_ID}", f"env.imports=[{gym_doors_env.__name__}]"]


def row(i: int, split: str | None = None, max_turns: int = 2) -> dict:
    extra = {"max_turns": max_turns, **({"split": split} if split else {})}
    return {
        "prompt": [{"role": "user", "content": f"question {i}"}],
        "env_class": skyrl_turns_env.ENV_ID,
        "reward_spec": {"ground_truth": str(i)},
        "extra_info": extra,
    }


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def skyrl_env(overrides):
    return load_config(None, [*SKYRL, *overrides]).env.build()


def test_skyrl_splits_come_from_extra_info_or_from_the_files(tmp_path):
    listed = write_jsonl(tmp_path / "all.jsonl", [row(0), row(1, "test"), row(2, "train")])
    env = skyrl_env([f"env.data_files=[{listed}]"])
    assert env.splits == ("train", "test")
    assert [t.task_id for t in env.tasks("train")] == ["train-0", "train-1"]
    assert env.tasks("test")[0].payload["reward_spec"] == {"ground_truth": "1"}
    a = write_jsonl(tmp_path / "a.jsonl", [row(0)])
    b = write_jsonl(tmp_path / "b.jsonl", [row(1), row(2)])
    by_file = skyrl_env([f"env.data_files={{train: [{a}], held: [{b}]}}"])
    assert by_file.splits == ("train", "held") and len(by_file.tasks("held")) == 2
    with pytest.raises(
        ValueError, match=r"split 'valid_unseen': environment 'skyrl_gym' has the splits train, held"
    ):
        by_file.tasks("valid_unseen")


def test_skyrl_reads_parquet_rows(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "rows.parquet"
    pd.DataFrame([row(0), row(1, "test")]).to_parquet(path)
    env = skyrl_env([f"env.data_files=[{path}]"])
    (task,) = env.tasks("test")
    assert task.payload["prompt"] == [{"role": "user", "content": "question 1"}]  # lists, not arrays
    assert task.payload["extra_info"]["max_turns"] == 2


def test_a_skyrl_row_without_prompt_or_env_class_is_one_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [row(0), {"prompt": "not messages", "env_class": "x"}])
    with pytest.raises(ValueError, match=r"bad.jsonl row 1: a row needs 'prompt' \(chat messages\)"):
        skyrl_env([f"env.data_files=[{bad}]"]).tasks("train")


def test_a_skyrl_episode_is_its_environment_made_from_its_row(tmp_path):
    env = skyrl_env([f"env.data_files=[{write_jsonl(tmp_path / 'r.jsonl', [row(0, max_turns=3)])}]"])
    source = env.source()
    source.prepare()
    (task,) = env.tasks("train")
    paying, idle = source.open(task, 2)  # every other instance pays (tests/env/skyrl_turns_env.py)
    if not paying._env.paying:
        paying, idle = idle, paying
    first = paying.reset()
    assert first.messages[0] == {"role": "system", "content": skyrl_turns_env.SYSTEM}
    assert first.messages[1:] == task.payload["prompt"] and first.admissible == []
    assert source.task_sentence(first) == "question 0"
    shown = [paying.step(f"reply {t}") for t in range(3)]
    assert [s.reward for s in shown] == [0.5, 0.5, 0.5] and [s.done for s in shown] == [False, False, True]
    assert shown[0].messages == [{"role": "user", "content": "Turn 1 heard. Go on."}]
    assert shown[-1].won and not shown[1].won  # ended by the environment, with a positive sum
    assert paying._env.heard == ["reply 0", "reply 1", "reply 2"]  # the replies, as sent
    idle.reset()
    assert not [idle.step("x") for _ in range(3)][-1].won  # a zero sum never wins
    final = EpisodeState("e", "", [], 0.5, True, True)
    assert env.trajectory_reward([0.5, 0.5, 0.5], final) == 1.5  # the rule: the steps' sum


def test_env_imports_that_fail_are_one_line():
    overrides = ["env.name=skyrl_gym", "env.data_files=[rows.jsonl]", "env.imports=[no_such_module_xyz]"]
    source = load_config(None, overrides).env.build().source()
    with pytest.raises(TaskError, match=r"env.imports: cannot import 'no_such_module_xyz'"):
        source.prepare()


def test_the_env_worker_carries_step_rewards_and_messages(tmp_path):
    env = skyrl_env([f"env.data_files=[{write_jsonl(tmp_path / 'r.jsonl', [row(0)])}]"])
    worker = EnvWorker(env.source())
    (task,) = env.tasks("train")
    opened = [
        RayEnvPool._state(eid, r)
        for eid, r in zip(["a", "b"], worker.reset_group(task, ["a", "b"]), strict=True)
    ]
    assert opened[0].messages[0]["role"] == "system" and opened[0].task == "question 0"
    stepped = worker.step({"a": "hello", "b": "hello"})
    states = {eid: RayEnvPool._state(eid, r) for eid, r in stepped.items()}
    assert sorted(s.reward for s in states.values()) == [0.0, 0.5]  # the environment's own rewards
    assert states["a"].messages == [{"role": "user", "content": "Turn 1 heard. Go on."}]
    worker.close(["a", "b"])


def test_gymnasium_tasks_are_seeds_and_info_lists_the_commands():
    env = load_config(
        None, [*GYM, "env.train_seeds=3", "env.test_seeds=2", "env.test_seed_start=100"]
    ).env.build()
    assert [t.payload["seed"] for t in env.tasks("train")] == [0, 1, 2]
    assert [t.task_id for t in env.tasks("test")] == ["seed-100", "seed-101"]
    with pytest.raises(ValueError, match=r"environment 'gymnasium' has the splits train, test"):
        env.tasks("valid_unseen")
    source = env.source()
    source.prepare()
    episode, _ = source.open(env.tasks("test")[0], 2)
    first = episode.reset()
    assert (
        first.obs == "You are in room 100. There are two doors."
        and first.admissible == gym_doors_env.COMMANDS
    )
    assert episode.step("look").admissible == gym_doors_env.COMMANDS
    last = episode.step("open the red door")
    assert last.done and last.won == (last.reward > 0)


def test_a_gymnasium_truncation_ends_the_episode_without_a_win():
    env = load_config(None, [*GYM, "env.kwargs={max_episode_steps: 1}"]).env.build()
    source = env.source()
    source.prepare()
    (episode,) = source.open(env.tasks("train")[0], 1)
    episode.reset()
    shown = episode.step("look")
    assert shown.done and not shown.won


def test_the_adapters_required_keys_are_one_line():
    with pytest.raises(ConfigError, match=r"env\.id: env.name=gymnasium needs env.id"):
        load_config(None, ["env.name=gymnasium"])
    with pytest.raises(ConfigError, match=r"env\.data_files: env.name=skyrl_gym needs env.data_files"):
        load_config(None, ["env.name=skyrl_gym"])


def test_the_integrations_open_a_task_of_any_registered_environment(tmp_path):
    from selective_rollout.integrations.agent_loop import environment_task

    env = skyrl_env([f"env.data_files=[{write_jsonl(tmp_path / 'r.jsonl', [row(0)])}]"])
    (task,) = env.tasks("train")
    source = environment_task(env, task, "action")

    async def play():
        episode, first = await source.open()
        shown = await episode.step("hello")
        await episode.close()
        return first, shown

    first, shown = asyncio.run(play())
    assert source.name == "train-0" and first.messages[0]["content"] == skyrl_turns_env.SYSTEM
    assert shown.messages == [{"role": "user", "content": "Turn 1 heard. Go on."}]
