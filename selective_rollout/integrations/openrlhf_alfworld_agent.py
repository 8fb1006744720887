"""Example ``--train.agent_func_path`` file for OpenRLHF: ALFWorld episodes under Selective Rollout.

OpenRLHF loads this file by path and calls ``AgentExecutor()`` with no arguments, so the gate is
configured by environment variables (they reach the rollout actors: a local Ray inherits the
driver's environment; on a cluster pass them with ``ray job submit --runtime-env-json``):
  SR_N_SAMPLES    required, equal to --rollout.n_samples_per_prompt
  SR_GATE         gate name (default prefix_edit); SR_GATE_PARAMS JSON (default {"k": 10, "tau": 0.12})
  SR_MAX_STEPS    environment steps per episode (default 30)
Each prompt's label is an ALFWorld game folder (``game.tw-pddl``); write the prompt file with
``python -m selective_rollout.integrations.openrlhf_alfworld_agent --games ROOT --split train --out F``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from openrlhf.utils.agent import AgentInstanceBase

from alfworld_env import load_games
from selective_rollout.envs import ENVS
from selective_rollout.envs.base import folder_task
from selective_rollout.gate import build_gate
from selective_rollout.integrations.episodes import ThreadedEpisode
from selective_rollout.integrations.openrlhf import (
    SelectiveRolloutExecutor,
    current_reply_token_ids,
    current_tokenizer,
)
from selective_rollout.rollout.actions import parse_action
from selective_rollout.rollout.prompts import PromptBuilder, user_text

FUZZY_THRESHOLD = 0.85
ENVIRONMENT = "alfworld"  # the registry entry whose game folders the prompts' labels name


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise RuntimeError(f"{name} is not set: it must equal --rollout.n_samples_per_prompt")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"{name} must be an integer, got {raw!r}") from None


class ALFWorldInstance(AgentInstanceBase):
    """One ALFWorld episode per sample, in-process; prompts rendered with the model's chat template."""

    def __init__(self) -> None:
        self.max_steps = _env_int("SR_MAX_STEPS", 30)
        self.steps = 0

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        self.tokenizer = current_tokenizer()
        environment = ENVS.build(ENVIRONMENT)
        self.builder = PromptBuilder(self.tokenizer, "react", environment.prompt)
        label = str(states["label"])
        self.episode, ob = await ThreadedEpisode.open_task(environment, folder_task(label, label, ""))
        self.admissible = ob.admissible
        ids = self.builder.prompt([], user_text(ob.obs, ob.admissible))
        return {"observation": self.tokenizer.decode(ids)}

    async def step(self, states: dict, **kwargs: Any) -> dict:
        parsed = parse_action(states["action_text"], self.admissible, "react", FUZZY_THRESHOLD)
        ob = await self.episode.step(parsed.command)
        self.steps += 1
        self.admissible = ob.admissible
        done = ob.won or self.steps >= self.max_steps
        feedback = ""
        if done:
            await self.episode.close()
        else:
            reply_ids = current_reply_token_ids()
            ended_turn = bool(reply_ids) and reply_ids[-1] == self.builder.eot_id
            ids = self.builder.continuation(user_text(ob.obs, ob.admissible), ended_turn)
            feedback = self.tokenizer.decode(ids)
        reward = float(ob.won)
        return {
            "rewards": torch.tensor(reward),
            "scores": reward,
            "environment_feedback": feedback,
            "done": done,
            "action": parsed.command,
            "extra_logs": {"won": reward, "valid_action": float(parsed.valid)},
        }


class AgentExecutor(SelectiveRolloutExecutor):
    """The class OpenRLHF looks up in an agent file."""

    def __init__(self) -> None:
        params = json.loads(os.environ.get("SR_GATE_PARAMS", '{"k": 10, "tau": 0.12}'))
        gate = build_gate(os.environ.get("SR_GATE", "prefix_edit"), **params)
        super().__init__(ALFWorldInstance, gate, n_samples_per_prompt=_env_int("SR_N_SAMPLES"))


def write_prompts(games_root: str, split: str, out: str) -> int:
    """One JSONL line per game: ``input`` (its task id) and ``label`` (its folder)."""
    games = load_games(games_root, split)
    with open(out, "w") as f:
        for g in games:
            f.write(json.dumps({"input": g.task_id, "label": str(Path(g.game_dir).resolve())}) + "\n")
    return len(games)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write an OpenRLHF prompt file of ALFWorld games.")
    ap.add_argument("--games", required=True, help="games root (alfworld_env.ensure_games)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    print(f"wrote {write_prompts(a.games, a.split, a.out)} prompts to {a.out}")
