"""launch/submit.py without a cluster: what it forwards, how it quotes, how it refuses bad input."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launch.submit import SubmitError, forwarded_env, main, runtime_env, train_entrypoint, with_runs_dir

REPO = Path(__file__).resolve().parents[2]


def test_forwards_run_variables_only_and_env_items_win() -> None:
    environ = {
        "WANDB_MODE": "offline",
        "WANDB_PROJECT": "sr",
        "ALFWORLD_DATA": "/data/alfworld",
        "HF_HOME": "/shared/hf",
        "HOME": "/root",
        "PATH": "/usr/bin",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    env = forwarded_env(environ, ["WANDB_MODE=online", "EXTRA=a=b"])
    assert env == {
        "WANDB_MODE": "online",
        "WANDB_PROJECT": "sr",
        "ALFWORLD_DATA": "/data/alfworld",
        "HF_HOME": "/shared/hf",
        "EXTRA": "a=b",
    }


def test_secrets_never_go_into_the_job_metadata(capsys) -> None:
    env = forwarded_env({"WANDB_API_KEY": "k", "WANDB_MODE": "online", "SR_HF_TOKEN": "t"})
    assert env == {"WANDB_MODE": "online"}
    err = capsys.readouterr().err
    assert "WANDB_API_KEY is set here but not forwarded" in err and "SR_HF_TOKEN" in err
    with pytest.raises(SubmitError, match="--env WANDB_API_KEY: secrets are not put into the job"):
        forwarded_env({}, ["WANDB_API_KEY=k"])


@pytest.mark.parametrize("item", ["NOVALUE", "=x", "1BAD=x", "BAD NAME=x"])
def test_bad_env_item_is_named(item: str) -> None:
    with pytest.raises(SubmitError, match=item.split("=")[0] or "="):
        forwarded_env({}, [item])


def test_driver_arguments_survive_the_shell() -> None:
    args = ["--config", "configs/my run.yaml", "gate.tau=0.1", "name=it's", "logging.backends=[jsonl]"]
    cmd = train_entrypoint(args, python="/opt/venv/bin/python")
    assert shlex.split(cmd) == ["/opt/venv/bin/python", "-m", "selective_rollout.train", *args]


def test_runtime_env_uploads_the_checkout_without_venvs_or_data() -> None:
    env = runtime_env(REPO, {"A": "1"})
    assert env["working_dir"] == str(REPO)
    assert {".venv", ".venv-*", "data", "runs", ".git"} <= set(env["excludes"])
    assert env["env_vars"] == {"A": "1"}
    assert "working_dir" not in runtime_env(None, {})


def test_runtime_env_rejects_a_missing_working_dir(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="nope"):
        runtime_env(tmp_path / "nope", {})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no cluster"),
        (["--command", "true", "--", "gate.tau=0.1"], "--command replaces the driver"),
        (["--address", "http://127.0.0.1:1", "--entrypoint-resources", "{bad"], "not JSON"),
        (["--address", "http://127.0.0.1:1", "--entrypoint-resources", '{"a": "x"}'], "object of numbers"),
        (["--address", "http://127.0.0.1:1", "--env", "oops"], "oops"),
    ],
)
def test_bad_invocations_exit_2_with_one_line(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err


def test_the_run_folder_lands_in_the_checkouts_runs_unless_the_arguments_choose_one() -> None:
    args = ["--config", "c.yaml", "gate.k=3"]
    assert with_runs_dir(args, "/repo/runs") == [*args, "driver.runs_dir=/repo/runs"]
    chosen_by_name = ("driver.runs_dir=/shared/runs", "driver.run_dir=/shared/runs/r1")
    for chosen in (*chosen_by_name, "train.runs_dir=/shared/runs", "train.run_dir=/shared/runs/r1"):
        assert with_runs_dir([*args, chosen], "/repo/runs") == [*args, chosen]
    assert with_runs_dir(args, "") == args
