"""The gate at inference time: G agent samples against any OpenAI-compatible chat endpoint.

Best-of-N and self-consistency run G samples of an agent loop and keep one answer. When the G
samples have converged on the same action prefix the extra samples add cost and no information,
so once the gate fires it cuts G-1 of them (their in-flight HTTP requests are cancelled, which
closes the connection; this package's server and vLLM's abort the generation) and let one survivor finish.
Its outcome is the group's answer; ``compare`` reports tokens saved and answer agreement against
running all G (same seeds, so the two runs agree up to the cut).

    python -m selective_rollout.integrations.infer --base-url http://127.0.0.1:8000/v1 --model M \\
        --games ROOT --split valid_seen --g 4 --gate prefix_edit --gate-params '{"k": 3, "tau": 0.12}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass

from selective_rollout.gate import Gate, build_gate
from selective_rollout.integrations.agent_loop import LoopConfig, alfworld_game, run_group
from selective_rollout.rollout.engines.openai_engine import OpenAIClient


@dataclass
class Comparison:
    game: str
    full_tokens: int
    gated_tokens: int
    fired: bool
    cut_step: int | None
    full_answer: bool
    gated_answer: bool

    @property
    def agree(self) -> bool:
        return self.full_answer == self.gated_answer


async def compare(
    base_url: str, cfg: LoopConfig, games: list[str], g: int, gate: Gate, timeout_s: float = 600.0
) -> list[Comparison]:
    """Per game: all G samples vs the gated run with the same seeds, side by side, over one client
    (``OpenAIClient``: an unreachable server or an error status is an ``EngineError`` naming the URL)."""
    out = []
    async with OpenAIClient(base_url, timeout_s=timeout_s) as client:
        for game in games:
            full = await run_group(client, cfg, alfworld_game(game), g, build_gate("none"))
            gated = await run_group(client, cfg, alfworld_game(game), g, gate)
            out.append(
                Comparison(
                    game,
                    full.completion_tokens,
                    gated.completion_tokens,
                    gated.fired,
                    gated.cut_step,
                    full.answer,
                    gated.answer,
                )
            )
    return out


def summarise(rows: list[Comparison]) -> dict[str, float]:
    full = sum(r.full_tokens for r in rows)
    gated = sum(r.gated_tokens for r in rows)
    return {
        "groups": len(rows),
        "fired": sum(r.fired for r in rows),
        "full_tokens": full,
        "gated_tokens": gated,
        "tokens_saved_frac": (full - gated) / full if full else 0.0,
        "answer_agreement": sum(r.agree for r in rows) / len(rows) if rows else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    from alfworld_env import load_games

    ap = argparse.ArgumentParser(
        description="Inference-time Selective Rollout over an OpenAI-compatible endpoint"
    )
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--games", required=True, help="games root (alfworld_env)")
    ap.add_argument("--split", default="valid_seen")
    ap.add_argument("--num-games", type=int, default=4)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--gate", default="prefix_edit")
    ap.add_argument("--gate-params", default='{"k": 3, "tau": 0.12}', help="JSON")
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    gate = build_gate(a.gate, **json.loads(a.gate_params))
    games = [x.game_dir for x in load_games(a.games, a.split)[: a.num_games]]
    cfg = LoopConfig(a.model, a.max_steps, a.max_tokens, a.temperature, a.seed)
    rows = asyncio.run(compare(a.base_url, cfg, games, a.g, gate))
    for r in rows:
        print(json.dumps({**asdict(r), "agree": r.agree}))
    print(json.dumps(summarise(rows)))


if __name__ == "__main__":
    main()
