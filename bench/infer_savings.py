"""Inference-time gate: tokens saved and answer agreement vs running all G, side by side.

Starts the package's OpenAI-compatible server (SmolLM2 on CPU) on loopback unless --base-url is given
(e.g. a ``vllm serve`` endpoint), generates tiny ALFWorld games, and runs every game twice with
the same seeds: all G samples, and gated (cut G-1 once the gate fires, one survivor finishes).

    PYTHONPATH=. python bench/infer_savings.py --num-games 4 --g 4 --k 2 --tau 0.3 [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from _tiny import parse_args

from alfworld_env import ensure_games, load_games
from selective_rollout.gate import build_gate
from selective_rollout.integrations.agent_loop import LoopConfig
from selective_rollout.integrations.infer import compare, summarise
from selective_rollout.integrations.serve import serve_subprocess
from selective_rollout.models import resolve_model


def _table(rows, summary) -> str:
    head = f"{'game':<34} {'fired':>5} {'cut@':>4} {'full tok':>8} {'gated tok':>9} {'saved':>6} "
    head += f"{'full':>5} {'gated':>5}"
    lines = [head, "-" * len(head)]
    for r in rows:
        saved = (r.full_tokens - r.gated_tokens) / r.full_tokens if r.full_tokens else 0.0
        lines.append(
            f"{Path(r.game).name[:34]:<34} {r.fired!s:>5} {r.cut_step or '-':>4} {r.full_tokens:>8} "
            f"{r.gated_tokens:>9} {saved:>6.1%} {r.full_answer!s:>5} {r.gated_answer!s:>5}"
        )
    lines.append("-" * len(head))
    lines.append(
        f"groups {summary['groups']}, fired {summary['fired']}, tokens {summary['full_tokens']} -> "
        f"{summary['gated_tokens']} (saved {summary['tokens_saved_frac']:.1%}), "
        f"answer agreement {summary['answer_agreement']:.0%}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible /v1 endpoint; default: start ours")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--num-games", type=int, default=4)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--tau", type=float, default=0.3)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    a = parse_args(ap, num_games=1, g=2, max_steps=2, max_tokens=8)
    with tempfile.TemporaryDirectory() as tmp:
        root = ensure_games(tmp, preset="tiny", n_train=a.num_games, n_valid=1, seed=a.seed)
        games = [x.game_dir for x in load_games(root, "train")[: a.num_games]]
        cfg = LoopConfig(a.model, a.max_steps, a.max_tokens, a.temperature, a.seed)
        gate = build_gate("prefix_edit", k=a.k, tau=a.tau)

        def run(url: str):
            return asyncio.run(compare(url, cfg, games, a.g, gate))

        if a.base_url:
            rows = run(a.base_url)
        else:
            with serve_subprocess(resolve_model("smollm2-135m-instruct"), name=a.model) as url:
                rows = run(url)
    print(f"G={a.g}, gate prefix_edit k={a.k} tau={a.tau}, T={a.temperature}, max_steps={a.max_steps}")
    print(_table(rows, summarise(rows)))


if __name__ == "__main__":
    main()
