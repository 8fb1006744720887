"""Where a config's warm-started policy is cached: its key and folder, without building it.

Kept apart from ``selective_rollout.sft`` (which builds the warm start and imports the learner's
modelling) so that the learner's export, which only needs to find the policy a run started from,
imports nothing above it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from selective_rollout.config import RunConfig


def warm_start_key(cfg: RunConfig, model_path: Path) -> str:
    """What identifies a warm start: the base model, the task set, the cloning and its learner."""
    ws, t = cfg.warm_start, cfg.trainer
    fields = [
        str(model_path),
        *cfg.env.build().cache_key(),  # alfworld: games folder, preset (the key as it always was)
        ws.games,
        ws.epochs,
        ws.lr,
        ws.seed,
        (cfg.env.model_extra or {}).get("games_seed"),  # a game-folder environment's set seed
        cfg.agent.model_dump_json(),
        t.lora.model_dump_json(),
        t.micro_batch_tokens,
        cfg.rollout.max_steps,
        "games in generation order",  # the selection rule (earlier: folder name order)
    ]
    return hashlib.sha256(json.dumps(fields, default=str).encode()).hexdigest()[:16]


def warm_start_dir(cfg: RunConfig, model_path: Path) -> Path:
    """The folder this config's warm-started policy is cached in (built or not)."""
    return Path(cfg.warm_start.cache_dir).expanduser() / warm_start_key(cfg, model_path)


def is_built(folder: Path) -> bool:
    return (folder / "config.json").is_file()
