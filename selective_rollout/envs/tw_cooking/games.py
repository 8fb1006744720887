"""TextWorld Cooking games generated offline by textworld's own ``tw-cooking`` challenge (the
generator behind ``tw-make tw-cooking``), at a few difficulty levels.

Game ``i`` of a split depends only on (seed, split, level, i), so a set can be extended and stays
identical. A game is kept only after its walkthrough (the generator's, minus the commands the
engine does not offer at that point, such as opening a fridge already open) has won it on the
real engine, winning on its last step; that walkthrough is written next to the game.

    python -m selective_rollout.envs.tw_cooking.games --out data/games/tw-cooking-medium --level medium
"""

from __future__ import annotations

import argparse
import json
import shutil
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from selective_rollout.envs.base import folder_task
from selective_rollout.records import Task

SPLITS = ("train", "valid_seen", "valid_unseen")
# tw-cooking deals foods (and ways to prepare them) into three disjoint sets: train foods for
# training, valid foods + unseen preparations for valid_seen, test ones for valid_unseen
_COOKING_SPLIT = {"train": "train", "valid_seen": "valid", "valid_unseen": "test"}
META = "walkthrough.json"
MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class Level:
    """tw-make's difficulty settings: ingredients in the recipe, how many must be fetched, rooms,
    and whether doors/containers must be opened, ingredients cooked (stove, oven, BBQ) and cut."""

    recipe: int
    take: int
    go: int
    open: bool
    cook: bool
    cut: bool
    about: str


LEVELS: dict[str, Level] = {
    "easy": Level(1, 1, 1, open=True, cook=False, cut=True, about="one ingredient, one room (kitchen)"),
    "medium": Level(2, 2, 6, open=True, cook=True, cut=True, about="two ingredients, six rooms"),
    "hard": Level(3, 3, 9, open=True, cook=True, cut=True, about="three ingredients, nine rooms"),
}


def level_of(name: str) -> Level:
    try:
        return LEVELS[name]
    except KeyError:
        raise ValueError(f"unknown tw-cooking level {name!r}; expected one of {sorted(LEVELS)}") from None


def _folder(out: Path, split: str, level: str, seed: int, index: int) -> Path:
    return out / split / f"{level}_s{seed}_{index:05d}"


def generate_game(out: Path, split: str, index: int, seed: int, level: str) -> Path:
    """Write game ``index`` of ``split`` under ``out/split`` (skipped when already there)."""
    from selective_rollout.envs.tw_cooking.engine import GAME_FILE

    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    folder = _folder(out, split, level, seed, index)
    if (folder / GAME_FILE).is_file() and (folder / META).is_file():
        return folder
    last_error = ""
    for attempt in range(MAX_ATTEMPTS):
        game_seed = zlib.crc32(f"{seed}:{split}:{level}:{index}:{attempt}".encode()) & 0xFFFF
        staging = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        walkthrough = _make(staging, split, level_of(level), game_seed)
        plan, why = _verified(staging / GAME_FILE, walkthrough)
        if plan is None:
            last_error = why
            shutil.rmtree(staging, ignore_errors=True)
            continue
        meta = {"walkthrough": plan, "level": level, "seed": game_seed, "settings": asdict(level_of(level))}
        (staging / META).write_text(json.dumps(meta, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        return folder
    raise RuntimeError(
        f"{split} game {index} ({level}): no winnable game in {MAX_ATTEMPTS} tries: {last_error}"
    )


def _make(folder: Path, split: str, level: Level, game_seed: int) -> list[str]:
    """tw-make's path for a challenge: the challenge's ``make`` then ``compile_game``."""
    import textworld
    import textworld.challenges

    _, make, _ = textworld.challenges.CHALLENGES["tw-cooking"]
    settings = {
        "recipe": level.recipe,
        "take": level.take,
        "go": level.go,
        "open": level.open,
        "cook": level.cook,
        "cut": level.cut,
        "drop": False,
        "recipe_seed": 0,
        "split": _COOKING_SPLIT[split],
    }
    options = textworld.GameOptions()
    options.seeds = game_seed
    options.path = str(folder / "game.z8")
    options.file_ext = ".z8"
    game = make(settings=settings, options=options)
    textworld.generator.compile_game(game, options)
    (folder / "game.ni").unlink(missing_ok=True)  # the Inform 7 source: only the compiler reads it
    return list(game.metadata["walkthrough"])


def _verified(game_file: Path, walkthrough: list[str]) -> tuple[list[str] | None, str]:
    """Play the walkthrough on the engine; keep only the commands it offers, and require a win on
    the last kept command."""
    from selective_rollout.envs.tw_cooking.engine import CookingEpisode

    episode = CookingEpisode(game_file)
    try:
        ob = episode.reset()
        plan: list[str] = []
        for command in walkthrough:
            if command not in ob.admissible:
                continue
            ob = episode.step(command)
            plan.append(command)
            if ob.done:
                break
    finally:
        episode.close()
    if not ob.won:
        return None, f"the walkthrough {plan} does not win"
    return plan, ""


def generate(out: str | Path, split: str, n: int, seed: int = 0, level: str = "medium") -> list[Path]:
    return [generate_game(Path(out), split, i, seed, level) for i in range(n)]


def ensure_games(root: str | Path, level: str, n_train: int, n_valid: int, seed: int = 0) -> Path:
    """Generate train / valid_seen / valid_unseen under ``root`` unless already there (idempotent)."""
    for split, n in (("train", n_train), ("valid_seen", n_valid), ("valid_unseen", n_valid)):
        generate(root, split, n, seed, level)
    return Path(root)


def load_tasks(root: str | Path, split: str, level: str, seed: int, n: int) -> list[Task]:
    """Exactly games ``0 .. n-1`` of the (level, seed) set of ``split``, in that order."""
    from selective_rollout.envs.tw_cooking.engine import GAME_FILE

    folders = [_folder(Path(root), split, level, seed, i) for i in range(n)]
    missing = [f for f in folders if not (f / GAME_FILE).is_file() or not (f / META).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{Path(root) / split} lacks {len(missing)} of the {n} tw-cooking {level} games (seed {seed}) "
            f"the config asks for, e.g. {missing[0].name}: generate them (env.generate=true, or python -m "
            f"selective_rollout.envs.tw_cooking.games --out {root} --level {level} --seed {seed} with "
            f"--n-train / --n-valid of at least {n})"
        )
    return [folder_task(str(f), f"{split}/{f.name}", f"tw-cooking-{level}") for f in folders]


def walkthrough(game_dir: str | Path) -> list[str]:
    """The verified walkthrough written with the game."""
    return list(json.loads((Path(game_dir) / META).read_text())["walkthrough"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="games root; each split goes to OUT/<split>/")
    ap.add_argument("--level", choices=sorted(LEVELS), default="medium")
    ap.add_argument("--n-train", type=int, default=24, help="train games (env.n_train)")
    ap.add_argument(
        "--n-valid", type=int, default=8, help="games of valid_seen and of valid_unseen (env.n_valid)"
    )
    ap.add_argument("--seed", type=int, default=0, help="env.games_seed")
    a = ap.parse_args(argv)
    root = ensure_games(a.out, a.level, a.n_train, a.n_valid, a.seed)
    print(f"tw-cooking {a.level}: {a.n_train} train, {a.n_valid} + {a.n_valid} held-out games in {root}")


if __name__ == "__main__":
    main()
