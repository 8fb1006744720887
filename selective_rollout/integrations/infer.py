"""The gate at inference time: G agent samples against any OpenAI-compatible chat endpoint.

Best-of-N and self-consistency run G samples of an agent loop and keep one answer. When the G
samples have converged on the same action prefix the extra samples add cost and no information,
so once the gate fires we cut G-1 of them (their in-flight HTTP requests are cancelled, which
closes the connection; our server and vLLM's abort the generation) and let one survivor finish.
Its outcome is the group's answer; ``compare`` reports tokens saved and answer agreement against
running all G (same seeds, so the two runs agree up to the cut).

    python -m selective_rollout.integrations.infer --base-url http://127.0.0.1:8000/v1 --model M \\
        --games ROOT --split valid_seen --g 4 --gate prefix_edit --gate-params '{"k": 3, "tau": 0.12}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from selective_rollout.envs.alfworld import Alfworld
from selective_rollout.gate import Gate, build_gate
from selective_rollout.integrations.episodes import ThreadedEpisode
from selective_rollout.integrations.live_group import LiveGroup
from selective_rollout.rollout.actions import parse_action
from selective_rollout.rollout.prompts import system_prompt, user_text


@dataclass
class SampleResult:
    actions: list[str] = field(default_factory=list)
    won: bool = False
    cut: bool = False
    completion_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class GroupResult:
    game: str
    samples: list[SampleResult]
    fired: bool
    cut_step: int | None
    reason: str

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.samples)

    @property
    def answer(self) -> bool:
        """Best-of-N success over the samples that ran to the end (the survivor, when cut)."""
        return any(s.won for s in self.samples if not s.cut)


@dataclass
class LoopConfig:
    model: str
    max_steps: int = 10
    max_tokens: int = 48
    temperature: float = 1.0
    seed: int = 0
    fuzzy_threshold: float = 0.85


class ChatEndpointError(RuntimeError):
    """The endpoint answered with an error or an unexpected body; the message says which."""


async def _chat(
    client: httpx.AsyncClient, cfg: LoopConfig, messages: list[dict], seed: int
) -> dict[str, Any]:
    body = {
        "model": cfg.model,
        "messages": messages,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "seed": seed,
    }
    resp = await client.post("chat/completions", json=body)
    if resp.status_code != 200:
        raise ChatEndpointError(f"{resp.request.url} answered {resp.status_code}: {resp.text[:300]}")
    data = resp.json()
    try:
        return {"text": data["choices"][0]["message"]["content"] or "", "usage": data.get("usage") or {}}
    except (KeyError, IndexError, TypeError):
        raise ChatEndpointError(
            f"{resp.request.url} returned no choices[0].message: {str(data)[:300]}"
        ) from None


async def _sample(
    client: httpx.AsyncClient, cfg: LoopConfig, group: LiveGroup, i: int, game_dir: str
) -> SampleResult:
    res = SampleResult()
    episode, ob = await ThreadedEpisode.open(game_dir)
    messages = [{"role": "system", "content": system_prompt("react", Alfworld.prompt)}]
    try:
        for step in range(cfg.max_steps):
            messages.append({"role": "user", "content": user_text(ob.obs, ob.admissible)})
            reply = await group.unless_cut(
                i, _chat(client, cfg, messages, cfg.seed * 100_003 + 1000 * i + step)
            )
            if reply is None:
                break
            res.completion_tokens += int(reply["usage"].get("completion_tokens", 0))
            res.prompt_tokens += int(reply["usage"].get("prompt_tokens", 0))
            messages.append({"role": "assistant", "content": reply["text"]})
            command = parse_action(reply["text"], ob.admissible, "react", cfg.fuzzy_threshold).command
            ob = await episode.step(command)
            res.actions.append(command)
            res.won = ob.won
            group.record(i, command)
            if ob.won or group.cut[i]:
                break
    finally:
        group.end(i)
        await episode.close()
    res.cut = group.cut[i]
    return res


async def run_group(
    client: httpx.AsyncClient, cfg: LoopConfig, game_dir: str | Path, g: int, gate: Gate, survivors: int = 1
) -> GroupResult:
    """Run G samples of one game concurrently; when the gate fires, all but ``survivors`` are cut."""
    group = LiveGroup(gate, g, survivors)
    samples = await asyncio.gather(*[_sample(client, cfg, group, i, str(game_dir)) for i in range(g)])
    reason = group.decision.reason if group.decision else "not fired"
    return GroupResult(str(game_dir), list(samples), group.fired, group.cut_step, reason)


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
    """Per game: all G samples vs the gated run with the same seeds, side by side."""
    out = []
    async with httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", timeout=timeout_s) as client:
        for game in games:
            full = await run_group(client, cfg, game, g, build_gate("none"))
            gated = await run_group(client, cfg, game, g, gate)
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
