"""A training checkpoint as a plain HF model folder: what ``policy_eval``, vLLM and the
inference-time gate load.

A run's checkpoints (``runs/<run>/checkpoints/iter_*``, ``trainer.checkpoint``) hold DeepSpeed's
state, made for resuming: the learner's module weights (all of them under ZeRO 0-2, only the
adapters under LoRA) and, under ZeRO-3, weights partitioned across the learners' optimizer
shards. Exporting rebuilds the policy the run trained: its starting model (the run's warm start
when it had one, as the trainer does), the checkpoint's weights loaded over it, LoRA adapters
merged by peft, saved with ``save_pretrained`` beside the tokenizer.

    python -m selective_rollout.learner.export runs/train-cpu --out runs/train-cpu/policy
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoTokenizer

from selective_rollout.config import ConfigError, RunConfig, load_config
from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner.checkpoint import DS_TAG, EXTRA_STATE, latest_checkpoint
from selective_rollout.learner.modeling import load_policy

log = logging.getLogger(__name__)


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(run folder, checkpoint folder)`` for a run folder (its latest checkpoint), its
    ``checkpoints`` folder, or one ``iter_*`` checkpoint in it."""
    path = Path(path)
    if (path / EXTRA_STATE).is_file():
        return path.parent.parent, path
    root = path / "checkpoints" if (path / "config.yaml").is_file() else path
    latest = latest_checkpoint(root)
    if latest is None:
        raise FileNotFoundError(f"no complete training checkpoint at or under {path}")
    return root.parent, latest


def run_folder_of(path: str | Path) -> Path | None:
    """The run folder when ``path`` names a run folder or one of its checkpoints (see
    ``find_checkpoint``); None for anything else, such as an HF model folder or a model alias."""
    path = Path(path)
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    try:
        return find_checkpoint(path)[0]
    except (FileNotFoundError, ValueError):
        return None


def checkpoint_weights(checkpoint: Path, zero_stage: int) -> dict[str, torch.Tensor]:
    """The trained module's weights under their module names, on CPU: DeepSpeed's module file
    under ZeRO 0-2, the fp32 weights DeepSpeed rebuilds from the partitions under ZeRO-3."""
    ds = checkpoint / DS_TAG
    if zero_stage == 3:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(checkpoint), tag=DS_TAG))
    files = sorted(ds.glob("mp_rank_*_model_states.pt"))
    if not files:
        raise FileNotFoundError(f"checkpoint {checkpoint} has no DeepSpeed model states in {ds}")
    return torch.load(files[0], map_location="cpu", weights_only=True)["module"]


def export_policy(checkpoint: Path, cfg: TrainerConfig, start_model: Path, out: Path) -> Path:
    """Write the policy of ``checkpoint`` (trained by ``cfg`` from ``start_model``) to ``out``."""
    policy = load_policy(start_model, cfg)
    state = checkpoint_weights(checkpoint, cfg.zero_stage)
    missing, unexpected = policy.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(
            f"checkpoint {checkpoint} holds weights the policy does not have ({', '.join(unexpected[:3])}"
            f"{', ...' if len(unexpected) > 3 else ''}): not a checkpoint of this run's model"
        )
    # under LoRA the checkpoint holds the adapters only (the frozen base is the start model's); a
    # tied alias (lm_head of tied embeddings) is no parameter of its own
    params = dict(policy.named_parameters())
    untrained = [n for n in missing if n in params and (not cfg.lora.enabled or "lora_" in n)]
    if untrained:
        raise ValueError(f"checkpoint {checkpoint} lacks trained weights: {', '.join(untrained[:3])}")
    model = policy.merge_and_unload() if cfg.lora.enabled else policy
    model.config.use_cache = True
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(start_model).save_pretrained(out)
    return out


def run_start_model(cfg: RunConfig, config_path: Path) -> Path:
    """The model a run started from, as the trainer resolved it: its warm start when enabled,
    which must be cached here (built by the run, or again by ``selective_rollout.sft``)."""
    from selective_rollout.models import resolve_model
    from selective_rollout.warm_start_cache import is_built, warm_start_dir

    path = resolve_model(cfg.engine.model, cfg.engine.model_cache_dir)
    if not cfg.warm_start.enabled:
        return path
    folder = warm_start_dir(cfg, path)
    if not is_built(folder):
        raise FileNotFoundError(
            f"the run started from a warm start that is not cached on this machine ({folder}): build "
            f"it again with `python -m selective_rollout.sft --config {config_path} --out {folder}`, "
            "then export"
        )
    return folder


def export_run(path: str | Path, out: str | Path) -> Path:
    """Export the checkpoint ``path`` names (see ``find_checkpoint``) with its run's config."""
    run_dir, checkpoint = find_checkpoint(path)
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{checkpoint} is not inside a run folder: no config.yaml in {run_dir}")
    cfg = load_config(config)
    exported = export_policy(checkpoint, cfg.trainer, run_start_model(cfg, config), Path(out))
    log.info("exported %s to %s", checkpoint, exported)
    return exported


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.learner.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", help="a run folder (its latest checkpoint), or one iter_* checkpoint")
    parser.add_argument("--out", required=True, type=Path, help="the HF model folder to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        export_run(args.checkpoint, args.out)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
