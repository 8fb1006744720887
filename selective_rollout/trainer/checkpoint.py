"""Checkpoint folders: atomic publication, discovery of the latest complete one, RNG state.

Layout under a checkpoint root: ``step_00000012/`` holds DeepSpeed's model, optimizer and
scheduler state (tag ``ds``), one ``rng_rank{r}.pt`` per learner and the driver's
``extra_state.pkl`` (iteration, data cursor, ...). Everything is written into
``.tmp-step_00000012/`` first and renamed into place last; a rename within one file system is
atomic, so a run killed mid-save leaves only a staging folder that discovery ignores.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

DS_TAG = "ds"
EXTRA_STATE = "extra_state.pkl"
_NAME = re.compile(r"^step_(\d{8})$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def staging_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f".tmp-{checkpoint_name(step)}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None (also if ``root`` is absent)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _NAME.match(p.name)) and p.is_dir() and (p / EXTRA_STATE).is_file()
    ]
    return max(found)[1] if found else None


def publish(staging: Path, final: Path, extra_state: dict[str, Any]) -> Path:
    """Write the driver's state into ``staging`` and rename it to ``final`` (replacing an older one)."""
    with (staging / EXTRA_STATE).open("wb") as fh:
        pickle.dump(extra_state, fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def read_extra_state(path: Path) -> dict[str, Any]:
    file = path / EXTRA_STATE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {EXTRA_STATE})")
    with file.open("rb") as fh:
        return pickle.load(fh)


def prune(root: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest complete checkpoints, and stale staging folders."""
    root = Path(root)
    complete = sorted(p for p in root.iterdir() if _NAME.match(p.name) and (p / EXTRA_STATE).is_file())
    for old in complete[:-keep]:
        shutil.rmtree(old)
    for stale in root.glob(".tmp-step_*"):
        shutil.rmtree(stale)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
