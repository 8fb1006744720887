"""Env throughput on the real engine: steps/s per worker and reset cost, with and without the
parse cache, plus the uniform-random-policy win rate within 15 steps per preset.

One env worker is one process, so measuring in this process gives the per-worker figures.
Usage: ``python bench/env_throughput.py [--games 12] [--episodes 120] [--presets tiny,small]
[--win-rate-only] [--tiny]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from _tiny import parse_args

from alfworld_env import GameInfo, load_games, speedups
from alfworld_env.engine import Episode
from alfworld_env.generate import generate


def _games(root: Path, preset: str, n: int) -> list[GameInfo]:
    generate(root / preset, "train", n, seed=0, preset=preset, progress=False)
    return load_games(root / preset, "train")


def _file(game: GameInfo) -> str:
    return str(Path(game.game_dir) / "game.tw-pddl")


def throughput(files: list[str], cached: bool, steps: int, group: int) -> dict[str, float]:
    speedups.enable(parse_cache=cached, translation_cache=cached)
    rng = random.Random(0)
    step_s, reset_s, n = 0.0, [], 0
    for f in files:
        t = time.perf_counter()
        eps = [Episode(f) for _ in range(group)]
        obs = [e.reset() for e in eps]
        reset_s.append((time.perf_counter() - t) / group)
        for e, ob in zip(eps, obs, strict=True):
            for _ in range(steps):
                t = time.perf_counter()
                ob = e.step(rng.choice(ob.admissible))
                step_s += time.perf_counter() - t
                n += 1
            e.close()
    return {
        "steps_per_s": n / step_s,
        "step_ms": 1000 * step_s / n,
        "reset_ms": 1000 * statistics.mean(reset_s),
    }


def random_win_rates(games: list[GameInfo], episodes: int, horizon: int = 15) -> dict[str, float]:
    """Share of episodes a uniform-random policy over the admissible commands wins within
    ``horizon`` steps: overall (key ``all``) and per task type (games are played round-robin)."""
    speedups.enable()
    rng, wins, played = random.Random(1), Counter(), Counter()
    for i in range(episodes):
        game = games[i % len(games)]
        ep = Episode(_file(game))
        ob = ep.reset()
        played[game.task_type] += 1
        for _ in range(horizon):
            ob = ep.step(rng.choice(ob.admissible))
            if ob.won:
                wins[game.task_type] += 1
                break
        ep.close()
    rates = {t: wins[t] / played[t] for t in sorted(played)}
    return {"all": sum(wins.values()) / episodes, **rates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=12)
    ap.add_argument("--episodes", type=int, default=120)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--group", type=int, default=4, help="G copies per game (reset cost is per copy)")
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--win-rate-only", action="store_true", help="skip the throughput table")
    args = parse_args(ap, games=2, episodes=2, steps=2, group=2, presets="tiny")
    presets = args.presets.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.win_rate_only:
            print(f"{'preset':8} {'cache':6} {'steps/s/worker':>15} {'step ms':>8} {'reset ms/copy':>14}")
            for preset in presets:
                files = [_file(g) for g in _games(Path(tmp), preset, args.games)]
                for cached in (False, True):
                    r = throughput(files, cached, args.steps, args.group)
                    print(
                        f"{preset:8} {'on' if cached else 'off':6} {r['steps_per_s']:15.1f} "
                        f"{r['step_ms']:8.2f} {r['reset_ms']:14.1f}"
                    )
        for preset in presets:
            rates = random_win_rates(_games(Path(tmp), preset, args.games), args.episodes)
            overall = rates.pop("all")
            print(f"uniform-random win rate, 15 steps, {preset}: {overall:.1%} ({args.episodes} episodes)")
            print("    " + ", ".join(f"{t} {r:.0%}" for t, r in rates.items()))


if __name__ == "__main__":
    main()
