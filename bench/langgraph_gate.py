"""The LangGraph node, gate on vs off, side by side: tokens saved and answer agreement with CIs.

Starts the package's OpenAI-compatible server (SmolLM2 on CPU) on loopback unless --base-url is given (e.g.
a ``vllm serve`` endpoint), generates ALFWorld games, and runs every game through two compiled
one-node graphs (``integrations.langgraph.gated_graph``) with the same sampling seeds: G samples
with the gate ``none`` (all run to the end), and G samples gated (cut all but one once the gate
fires). No mock transport: real HTTP, real engine, real game engine. Prints a row per game, then
the pooled tokens saved, the mean per-game saving and the share of games whose best-of-N answer
agrees, each with a bootstrap 95% CI over games.

    PYTHONPATH=. python bench/langgraph_gate.py --num-games 8 --g 4 --k 2 --tau 0.3 [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import numpy as np
from _tiny import parse_args

from alfworld_env import ensure_games, load_games
from selective_rollout.gate import build_gate
from selective_rollout.integrations.agent_loop import LoopConfig
from selective_rollout.integrations.langgraph import GatedSamples, gated_graph
from selective_rollout.integrations.serve import serve_subprocess
from selective_rollout.models import resolve_model
from selective_rollout.stats import bootstrap_ci


def pooled_saving_ci(full: np.ndarray, gated: np.ndarray, resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap CI of 1 - sum(gated) / sum(full), resampling games."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(full), size=(resamples, len(full)))
    ratios = 1.0 - gated[picks].sum(axis=1) / np.maximum(full[picks].sum(axis=1), 1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


async def side_by_side(base_url: str, games: list[str], args: argparse.Namespace) -> list[dict]:
    loop = LoopConfig(args.model, args.max_steps, args.max_tokens, args.temperature, args.seed)
    gate = build_gate("prefix_edit", k=args.k, tau=args.tau)
    off = gated_graph(GatedSamples(base_url, args.model, build_gate("none"), g=args.g, loop=loop))
    on = gated_graph(GatedSamples(base_url, args.model, gate, g=args.g, loop=loop))
    rows = []
    for game in games:
        full = (await off.ainvoke({"task": game}))["gated"]
        cut = (await on.ainvoke({"task": game}))["gated"]
        rows.append({"game": game, "full": full, "gated": cut})
        print(
            f"{Path(game).name[:30]:<30} fired {cut['fired']!s:>5} cut@{cut['cut_step'] or '-':>2} "
            f"tokens {full['tokens_spent']:>5} -> {cut['tokens_spent']:>5} "
            f"answer {full['answer']!s:>5} / {cut['answer']!s:>5}",
            flush=True,
        )
    return rows


def summary(rows: list[dict]) -> str:
    full = np.array([r["full"]["tokens_spent"] for r in rows], dtype=float)
    gated = np.array([r["gated"]["tokens_spent"] for r in rows], dtype=float)
    agree = [float(r["full"]["answer"] == r["gated"]["answer"]) for r in rows]
    per_game = [1.0 - g / f if f else 0.0 for f, g in zip(full, gated, strict=True)]
    pooled = 1.0 - gated.sum() / max(full.sum(), 1.0)
    lo, hi = pooled_saving_ci(full, gated)
    mlo, mhi = bootstrap_ci(per_game)
    alo, ahi = bootstrap_ci(agree)
    fired = sum(r["gated"]["fired"] for r in rows)
    return (
        f"{len(rows)} games, gate fired in {fired}: tokens {full.sum():.0f} -> {gated.sum():.0f}, "
        f"saved {pooled:.1%} (CI {lo:.1%}..{hi:.1%}); per-game mean {np.mean(per_game):.1%} "
        f"(CI {mlo:.1%}..{mhi:.1%}); answer agreement {np.mean(agree):.0%} (CI {alo:.0%}..{ahi:.0%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint; default: start ours")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--preset", default="tiny", help="alfworld_env preset of the generated games")
    ap.add_argument("--num-games", type=int, default=8)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--tau", type=float, default=0.3)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = parse_args(ap, num_games=1, g=2, max_steps=2, max_tokens=8)
    with tempfile.TemporaryDirectory(prefix="langgraph-games-") as root:
        ensure_games(root, preset=args.preset, n_train=0, n_valid=args.num_games)
        games = [str(x.game_dir) for x in load_games(root, "valid_seen")[: args.num_games]]
        if args.base_url:
            rows = asyncio.run(side_by_side(args.base_url, games, args))
        else:
            with serve_subprocess(resolve_model("smollm2-135m-instruct"), name=args.model) as url:
                rows = asyncio.run(side_by_side(url, games, args))
    print(summary(rows))


if __name__ == "__main__":
    main()
