"""SFT warm start: behaviour-clone the generator's walkthroughs before RL.

Unprompted SmolLM2-135M wins nothing on ALFWorld, and GRPO learns nothing from groups that
all fail; standard practice for agent RL is a short supervised warm start. Each train game's
walkthrough (the environment's: ALFWorld's from the scripted solver, TextWorld Cooking's from
its generator) is replayed in the environment's real engine to get the observations and
admissible commands the policy will see, and rendered with the *same* prompt
format and token-level dialogue building as RL rollouts (``Agent`` / ``Conversation``), so the
cloned policy is evaluated and trained in exactly the format it learned. The loss is the mean
negative log-likelihood of the expert's reply tokens (the RL loss mask), over the trainer's
token-budget micro-batches.

    python -m selective_rollout.sft --games data/games/tiny --out warm/ [--config ...] [--epochs 2]

``make train`` uses a cached warm start (``warm_start.enabled``): built once per
(model, games, budget) key, reused afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from selective_rollout.config import ConfigError, RunConfig, load_config
from selective_rollout.envs.base import TaskError
from selective_rollout.process_memory import in_fresh_process
from selective_rollout.records import Experience, Task
from selective_rollout.warm_start_cache import is_built, warm_start_dir

if TYPE_CHECKING:
    from selective_rollout.envs import Environment

log = logging.getLogger(__name__)


def expert_reply(action: str, action_format: str) -> str:
    """The reply the policy should have written for ``action`` in its action format."""
    if action_format == "react":
        return f"Thought: the next step of the plan is to {action}.\nAction: {action}"
    return action


def expert_dialogue(task: Task, agent, max_steps: int, env: Environment) -> list[Experience]:
    """Replay a task's walkthrough in the environment's engine and render it as training
    sequences (one per history-window segment, exactly as RL rollouts are packed). A task that
    cannot be played raises ``TaskError`` naming it."""
    walkthrough = env.walkthrough(task)
    if not walkthrough:
        raise TaskError(f"{task.task_id}: the task has no walkthrough to clone")
    if len(walkthrough) > max_steps:
        raise ValueError(
            f"{task.task_id}: walkthrough of {len(walkthrough)} steps exceeds rollout.max_steps={max_steps}"
        )
    episode = env.episode(task)
    try:
        first = episode.reset()
        sentence = env.task_of(first)
        conv = agent.start(sentence, first.obs, first.admissible)
        tokenizer = agent.builder.tokenizer
        won = False
        for action in walkthrough:
            reply = expert_reply(action, agent.cfg.action_format)
            ids = list(tokenizer(reply, add_special_tokens=False).input_ids) + [agent.builder.eot_id]
            conv.add_completion(ids, reply)
            ob = episode.step(action)
            won = ob.won
            if ob.done:
                break
            conv.extend(ob.obs, ob.admissible)
    finally:
        episode.close()
    if not won:
        raise TaskError(
            f"{task.task_id}: replaying the walkthrough did not win; the task or solver is broken"
        )
    return conv.experiences(task.task_id, task.task_id, "", reward=1.0)


def clone_walkthroughs(tasks: Sequence[Task], agent, max_steps: int, env: Environment) -> list[Experience]:
    """The expert dialogues of ``tasks``; a task the environment cannot play is named in one line
    and skipped, as the rollout skips it (a run stops only when none is left)."""
    data: list[Experience] = []
    unplayable = (TaskError, OSError, ValueError, *env.source().errors)
    for task in tasks:
        try:
            data += expert_dialogue(task, agent, max_steps, env)
        except unplayable as exc:
            log.warning("warm start: skipping task %s: %s", task.task_id, str(exc).splitlines()[0])
    if not data:
        raise TaskError(f"warm start: none of the {len(tasks)} tasks could be played (see the lines above)")
    return data


def train_sft(
    model_path: Path, data: Sequence[Experience], cfg: RunConfig, out_dir: Path
) -> dict[str, float]:
    """Full or LoRA fine-tuning (as ``trainer.lora``) on the expert dialogues; saves an HF folder.
    A progress bar per epoch (``logging.progress``, like the iterations'): the first warm start
    takes about a minute on 2 cores, and a run must not look stuck meanwhile."""
    from tqdm import tqdm

    from selective_rollout.learner.modeling import hf_model, load_policy, merged_weights, token_logprobs
    from selective_rollout.learner.packing import collate, plan_micro_batches

    ws = cfg.warm_start
    torch.manual_seed(ws.seed)
    model = load_policy(model_path, cfg.trainer)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=ws.lr)
    rng = random.Random(ws.seed)
    order = list(range(len(data)))
    losses = []
    for epoch in range(ws.epochs):
        rng.shuffle(order)
        plans = plan_micro_batches([len(data[i].token_ids) for i in order], cfg.trainer.micro_batch_tokens)
        bar = tqdm(
            plans,
            desc=f"warm start epoch {epoch + 1}/{ws.epochs}",
            unit="batch",
            disable=not cfg.logging.progress,
            mininterval=2,
        )
        for plan in bar:
            batch = [data[order[i]] for i in plan]
            mb = collate(batch, [0.0] * len(batch))
            logp = token_logprobs(model, mb.input_ids, mb.attention_mask, positions=mb.loss_mask > 0).logprobs
            loss = -(logp * mb.loss_mask).sum() / mb.loss_mask.sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.max_grad_norm or float("inf"))
            optimizer.step()
            losses.append(loss.item())
            bar.set_postfix(nll=f"{loss.item():.3f}", refresh=False)
        log.info(
            "sft epoch %d/%d: mean nll %.4f", epoch + 1, ws.epochs, sum(losses[-len(plans) :]) / len(plans)
        )
    base = hf_model(model)
    if cfg.trainer.lora.enabled:
        state = dict(merged_weights(model))
        from transformers import AutoModelForCausalLM

        plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        plain.load_state_dict(state, strict=False)
        base = plain
    base.save_pretrained(out_dir)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_path).save_pretrained(out_dir)
    return {"sft/final_nll": losses[-1], "sft/first_nll": losses[0], "sft/sequences": float(len(data))}


def warm_start_games(cfg: RunConfig, games_root: str | Path | None = None) -> list[Task]:
    """The first ``warm_start.games`` train tasks of the run's environment (of ``games_root``, when
    given, for an environment of game folders). Generated games are taken in generation order,
    which for ALFWorld deals the six task types round-robin; the folders' name order would clone
    the alphabetically first types only (the first 24 of 40 held no heat and no two-object task)."""
    section = cfg.env if games_root is None else cfg.env.model_copy(update={"games_dir": str(games_root)})
    return section.build().tasks("train")[: cfg.warm_start.games]


def build_warm_start(
    cfg: RunConfig, model_path: Path, games_root: str | Path | None, out_dir: Path
) -> dict[str, float]:
    """Clone the walkthroughs of ``warm_start_games`` into ``out_dir`` (written atomically)."""
    from selective_rollout.rollout.agent import Agent

    env = cfg.env.build()
    agent = Agent.from_model(cfg.agent, model_path, env.prompt)
    games = warm_start_games(cfg, games_root)
    data = clone_walkthroughs(games, agent, cfg.rollout.max_steps, env)
    staging = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    stats = train_sft(model_path, data, cfg, staging)
    (staging / "sft_stats.json").write_text(json.dumps(stats, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(staging, out_dir)
    return stats


def warm_start_model(cfg: RunConfig, model_path: Path) -> Path:
    """The cached warm-started policy for this config, built on first use."""
    out = warm_start_dir(cfg, model_path)
    if is_built(out):
        log.info("warm start: using cached %s", out)
        return out
    from selective_rollout.runtime import train_tasks

    train_tasks(cfg)  # generates the games on first use
    log.info(
        "warm start: cloning %d walkthroughs into %s (first use; cached after)", cfg.warm_start.games, out
    )
    # in a process of its own: the fine-tuning's gigabytes (weights, Adam state, activations of every
    # length) would otherwise stay resident in the driver for the whole run
    in_fresh_process(build_warm_start, cfg, model_path, None, out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.sft",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--games",
        type=Path,
        default=None,
        help="games root with a train/ split (an environment of game folders)",
    )
    parser.add_argument("--out", required=True, type=Path, help="output HF model folder")
    parser.add_argument("--config", default="configs/cpu_default.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. warm_start.epochs=3")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
        from selective_rollout.models import resolve_model

        model = resolve_model(cfg.engine.model, cfg.engine.model_cache_dir)
        stats = build_warm_start(cfg, model, args.games, args.out)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
