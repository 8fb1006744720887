"""Checkpoint folders: atomic publication, discovery of the latest complete one, RNG state.

Layout under a checkpoint root: ``iter_00000012/`` (the state after 12 iterations) holds
DeepSpeed's model, optimizer and scheduler state (tag ``ds``), one ``rng_rank{r}.pt`` per
learner and the driver's ``extra_state.json`` (iteration, data cursor, ...). Everything is
written into ``.tmp-iter_00000012/`` first and renamed into place last; a rename within one file
system is atomic, so a run killed mid-save leaves only a staging folder that discovery ignores,
and the older checkpoints are pruned only after the new one is in place.

Nothing here unpickles: the driver's state is JSON and the RNG state holds tensors and plain
numbers only (``torch.load(weights_only=True)``), so a file planted in a run folder cannot run
code at resume. Folders are named by iteration, not by learner step: an iteration without an
update does not advance the step.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

DS_TAG = "ds"
EXTRA_STATE = "extra_state.json"
_NAME = re.compile(r"^iter_(\d{8})$")
_LEGACY = re.compile(r"^step_\d{8}$")  # before 2026-12: named by step, driver state pickled


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:08d}"


def staging_dir(root: str | Path, iteration: int) -> Path:
    return Path(root) / f".tmp-{checkpoint_name(iteration)}"


def _complete(root: Path) -> list[tuple[int, Path]]:
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _NAME.match(p.name)) and p.is_dir() and (p / EXTRA_STATE).is_file()
    )


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint of the latest iteration under ``root``, or None (also if ``root``
    is absent). A root holding only checkpoints of the earlier, pickled format is an error: a run
    must not silently restart from scratch over work it cannot read."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = _complete(root)
    if found:
        return found[-1][1]
    if legacy := sorted(p.name for p in root.iterdir() if _LEGACY.match(p.name)):
        raise ValueError(
            f"{root} holds only checkpoints of an earlier version ({', '.join(legacy)}: pickled driver "
            "state, which this version does not load because a pickle can run code); resume it with the "
            "version that wrote it, or start a new run folder"
        )
    return None


def publish(staging: Path, final: Path, extra_state: dict[str, Any]) -> Path:
    """Write the driver's state into ``staging`` and rename it to ``final``.

    A folder already at ``final`` (the same iteration saved twice) is moved aside before the
    rename and deleted after it, so there is no moment without a complete checkpoint on disk
    except between those two renames.
    """
    _write_synced(staging / EXTRA_STATE, extra_state)
    aside = final.with_name(f".old-{final.name}")
    if final.exists():
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(final, aside)
    os.replace(staging, final)
    if aside.exists():
        shutil.rmtree(aside)
    return final


def update_extra_state(path: Path, extra_state: dict[str, Any]) -> None:
    """Replace the driver's state of the complete checkpoint ``path`` atomically, leaving its
    weights and optimizer state as they are: what the run learned after its last update (the
    final held-out evaluation) is kept without writing the whole model again."""
    file = _extra_state_file(path)
    staged = file.with_name(f".{EXTRA_STATE}.tmp")
    _write_synced(staged, extra_state)
    os.replace(staged, file)


def _write_synced(file: Path, extra_state: dict[str, Any]) -> None:
    """The driver's state as JSON, on disk before any rename publishes it."""
    with file.open("w") as fh:
        json.dump(extra_state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _extra_state_file(path: Path) -> Path:
    file = path / EXTRA_STATE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {EXTRA_STATE})")
    return file


def read_extra_state(path: Path) -> dict[str, Any]:
    return json.loads(_extra_state_file(path).read_text())


def prune(root: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest complete checkpoints, and stale staging folders."""
    root = Path(root)
    for _, old in _complete(root)[:-keep]:
        shutil.rmtree(old)
    for stale in [*root.glob(".tmp-iter_*"), *root.glob(".old-iter_*")]:
        shutil.rmtree(stale)


def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain numbers (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    nps = state["numpy"]
    keys = nps["keys"].numpy().astype(np.uint32)
    np.random.set_state((nps["kind"], keys, nps["pos"], nps["has_gauss"], nps["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rng(path: Path) -> None:
    torch.save(rng_state(), path)


def load_rng(path: Path) -> None:
    set_rng_state(torch.load(path, weights_only=True))
