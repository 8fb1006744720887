"""Generate ALFWorld-domain games offline: ``python -m alfworld_env.generate --out DIR --n N ...``.

Game ``i`` of a split depends only on (seed, split, i), so a tree can be extended or regenerated
piecewise and stays identical. Task types are dealt round-robin, so any 6 consecutive games
cover all six. A game is written only after the scripted solver has won it on the real engine.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from tqdm import tqdm

from alfworld_env.presets import PRESETS, TASK_TYPES, preset_of
from alfworld_env.problem import game_json, task_text, write_game
from alfworld_env.scenario import sample_scenario
from alfworld_env.solver import Unsolvable, solve

SPLITS = ("train", "valid_seen", "valid_unseen")
MAX_ATTEMPTS = 20


def generate_game(out: Path, split: str, index: int, seed: int, preset: str) -> Path:
    """Write game ``index`` of ``split`` under ``out/split`` (skipped when already there)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    preset = preset_of(preset, index)
    task_type = TASK_TYPES[index % len(TASK_TYPES)]
    existing = sorted((out / split).glob(f"*/trial_{preset}_s{seed}_{index:05d}/game.tw-pddl"))
    if existing:
        return existing[0].parent
    last_error: Exception | None = None
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(f"{seed}:{split}:{index}:{attempt}")
        scn = sample_scenario(task_type, split == "valid_unseen", PRESETS[preset], rng)
        scn.task_text = task_text(scn, rng)
        target = scn.parent_target or scn.toggle_target
        folder = out / split / f"{task_type}-{scn.object_target}-None-{target}-{scn.room}"
        folder = folder / f"trial_{preset}_s{seed}_{index:05d}"
        game = game_json(scn, f"{split}_{index}", walkthrough=[])
        try:
            game["walkthrough"] = solve(scn, game)
        except Unsolvable as exc:
            last_error = exc
            continue
        write_game(folder, game, scn)
        return folder
    raise RuntimeError(
        f"{split} game {index}: no solvable {task_type} game in {MAX_ATTEMPTS} tries: {last_error}"
    )


def generate(
    out: str | Path, split: str, n: int, seed: int = 0, preset: str = "tiny", progress: bool = True
) -> list[Path]:
    out = Path(out)
    it = tqdm(range(n), desc=f"{split} ({preset})", unit="game", disable=not progress)
    return [generate_game(out, split, i, seed, preset) for i in it]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="root folder; games go to OUT/SPLIT/...")
    ap.add_argument("--n", type=int, required=True, help="number of games in the split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", choices=SPLITS, default="train")
    ap.add_argument("--preset", default="tiny", help=f"one of {sorted(PRESETS)}, or a mix like tiny+small")
    args = ap.parse_args(argv)
    folders = generate(args.out, args.split, args.n, args.seed, args.preset)
    print(f"{len(folders)} games in {Path(args.out) / args.split}")


if __name__ == "__main__":
    main()
