"""Finding playable games on disk: the generated tree or ALFWorld's official ``json_2.1.1``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from alfworld_env.generate import SPLITS, generate
from alfworld_env.presets import preset_of


@dataclass(frozen=True)
class GameInfo:
    game_dir: str  # folder with game.tw-pddl (+ traj_data.json)
    task_id: str  # "<split>/<path below the split>"
    task_type: str


def _split_root(root: str | Path, split: str, source: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if source == "generated":
        path = Path(root) / split
        fix = f"generate it with `python -m alfworld_env.generate --out {root} --split {split} --n N`"
    elif source == "official":
        # ``root`` only: importing alfworld sets ALFWORLD_DATA to ~/.cache/alfworld behind the caller's back,
        # so the variable is read where the caller chooses (the GPU configs: env.games_dir defaults to it)
        path = Path(root) / "json_2.1.1" / split
        fix = "download ALFWorld's data (`alfworld-download`); point env.games_dir (or ALFWORLD_DATA) at it"
    else:
        raise ValueError(f"unknown game source {source!r}; expected 'generated' or 'official'")
    if not path.is_dir():
        raise FileNotFoundError(f"no {source} games at {path}: {fix}")
    return path


def load_games(root: str | Path, split: str, source: str = "generated") -> list[GameInfo]:
    """Every solvable game of a split, sorted by task id.

    ``official`` reads ``<root>/json_2.1.1/<split>`` (``root`` is ALFWorld's data folder, what
    ``$ALFWORLD_DATA`` names) and, like ALFWorld, skips movable-receptacle and sliced tasks and games marked
    unsolvable.
    """
    base = _split_root(root, split, source)
    games = []
    for traj in sorted(base.rglob("traj_data.json")):
        folder = traj.parent
        game_file = folder / "game.tw-pddl"
        if not game_file.is_file() or "movable" in str(folder) or "Sliced" in str(folder):
            continue
        if not json.loads(game_file.read_text()).get("solvable", False):
            continue
        task_type = json.loads(traj.read_text())["task_type"]
        games.append(GameInfo(str(folder), f"{split}/{folder.relative_to(base).as_posix()}", task_type))
    if not games:
        raise FileNotFoundError(f"no playable games (traj_data.json + solvable game.tw-pddl) under {base}")
    return games


def load_generated(root: str | Path, split: str, preset: str, seed: int, n: int) -> list[GameInfo]:
    """Exactly the generated set ``(preset, seed)``, games ``0 .. n-1`` of ``split``, in that order
    (task types round-robin, so any prefix is balanced): a folder may hold more (a larger ``n``
    generated earlier, another preset or seed), which are not used."""
    wanted = {f"trial_{preset_of(preset, i)}_s{seed}_{i:05d}": i for i in range(n)}
    games = [g for g in load_games(root, split) if Path(g.game_dir).name in wanted]
    games.sort(key=lambda g: wanted[Path(g.game_dir).name])
    if len(games) < n:
        raise FileNotFoundError(
            f"{Path(root) / split} holds {len(games)} of the {n} {preset} games (seed {seed}) the config "
            f"asks for: generate them (env.generate=true, or python -m alfworld_env.generate --out {root} "
            f"--split {split} --n {n} --preset {preset} --seed {seed})"
        )
    return games


def ensure_games(
    root: str | Path, preset: str = "tiny", n_train: int = 60, n_valid: int = 12, seed: int = 0
) -> Path:
    """Generate train / valid_seen / valid_unseen under ``root`` unless already there (idempotent)."""
    root = Path(root)
    for split, n in (("train", n_train), ("valid_seen", n_valid), ("valid_unseen", n_valid)):
        generate(root, split, n, seed=seed, preset=preset)
    return root
