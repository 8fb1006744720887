"""The transformers engine's resident memory under rollout traffic, on glibc's malloc vs jemalloc.

glibc keeps much of what tensors of ever-different lengths free (prompts, session KV, decode
batches), so a CPU engine's resident memory grows far past what it holds (process_memory.py);
``placement.engine_allocator=jemalloc`` starts the engines on the jemalloc that Ray's wheel
ships. Each arm runs in a fresh process (resident memory is per process; the allocator is chosen
when it starts) and plays the same waves of groups: ``--group-size`` trajectories per group share
a first prompt of 80-200 words, then take 6-15 turns, each adding an 8-40-word observation and
sampling a constrained reply among 5-25 commands, over one session each; sessions are released
when the group ends. Everything is drawn from per-trajectory seeds, so the arms see the same traffic.
Prints, per arm, the peak and final resident memory (sampled every 0.25 s), the session KV the
engine held at the peak and the wall-clock, then the ratios jemalloc / glibc:

    python bench/engine_memory.py [--config configs/cpu_default.yaml --waves 2 --groups 3 --repeats 1]
        [--malloc-conf background_thread:true ...]   # more jemalloc arms, one per MALLOC_CONF
        [--tiny]                                     # one wave of one group of 2 (what CI runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

from _tiny import parse_args

from selective_rollout.process_memory import in_fresh_process, jemalloc_library

WORDS = [
    *("cabinet", "drawer", "fridge", "countertop", "shelf", "sinkbasin"),
    *("microwave", "toaster", "garbagecan", "desk", "lamp", "bed"),
]
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M in bf16: K and V, 30 layers, 3 KV heads of 64


def _text(rng: random.Random, words: int) -> str:
    return " ".join(f"{rng.choice(WORDS)} {rng.randint(1, 20)}" for _ in range(words))


def run_arm(config: str, waves: int, groups: int, group_size: int) -> dict[str, Any]:
    """One arm, in a fresh process (``in_fresh_process``); returns its figures."""
    import psutil

    from selective_rollout.config import load_config
    from selective_rollout.models import resolve_model
    from selective_rollout.rollout.engines import SamplingParams, engine_class

    cfg = load_config(config, [])
    engine = engine_class("transformers")(
        cfg.engine, resolve_model(cfg.engine.model, cfg.engine.model_cache_dir)
    )
    tok, proc = engine.tokenizer, psutil.Process()
    peak = {"rss": 0, "kv_tokens": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            rss = proc.memory_info().rss
            if rss > peak["rss"]:
                peak.update(rss=rss, kv_tokens=engine._store.cached_tokens)

    async def trajectory(g: int, j: int, first: list[int], turns: int) -> None:
        rng, prompt = random.Random(g * 1000 + j), list(first)
        for t in range(turns):
            prompt += tok(_text(rng, rng.randint(8, 40)), add_special_tokens=False).input_ids
            choices = [f"go to {rng.choice(WORDS)} {rng.randint(1, 9)}" for _ in range(rng.randint(5, 25))]
            sampling = SamplingParams(
                max_tokens=16, temperature=1.0, seed=g * 10_000 + j * 100 + t, choices=choices
            )
            reply = await engine.generate(f"{g}-{j}-{t}", prompt, sampling, session_id=f"{g}-{j}")
            prompt += reply.outputs[0].token_ids
        await engine.release([f"{g}-{j}"])

    async def group(g: int) -> None:
        rng = random.Random(g)
        first = tok(_text(rng, rng.randint(80, 200)), add_special_tokens=False).input_ids
        turns = rng.randint(6, 15)
        await asyncio.gather(*(trajectory(g, j, first, turns) for j in range(group_size)))

    async def play() -> dict[str, Any]:
        await engine.generate(
            "warmup", tok("warm up", add_special_tokens=False).input_ids, SamplingParams(max_tokens=2)
        )
        started = time.perf_counter()
        for wave in range(waves):
            await asyncio.gather(*(group(wave * groups + i) for i in range(groups)))
        wall = time.perf_counter() - started
        return {"wall_s": wall, **(await engine.health())}

    threading.Thread(target=sample, daemon=True).start()
    health = asyncio.run(play())
    stop.set()
    return {
        "wall_s": round(health["wall_s"], 1),
        "peak_rss_gb": round(peak["rss"] / 1e9, 2),
        "final_rss_gb": round(proc.memory_info().rss / 1e9, 2),
        "kv_at_peak_gb": round(peak["kv_tokens"] * KV_BYTES_PER_TOKEN / 1e9, 2),
        "generated_tokens": health["generated_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/cpu_default.yaml")
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--groups", type=int, default=3, help="groups played together in a wave")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of all arms, alternating")
    ap.add_argument(
        "--malloc-conf",
        nargs="*",
        default=[],
        help="more jemalloc arms, one per MALLOC_CONF string (e.g. background_thread:true)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parse_args(ap, waves=1, groups=1, group_size=2)
    lib = jemalloc_library()
    if lib is None:
        raise SystemExit("no jemalloc: this Ray's wheel ships no ray/core/libjemalloc.so")
    arms = [("glibc", {}), ("jemalloc", {"LD_PRELOAD": str(lib)})]
    arms += [(f"jemalloc {conf}", {"LD_PRELOAD": str(lib), "MALLOC_CONF": conf}) for conf in args.malloc_conf]
    results = []
    for _ in range(args.repeats):
        for label, env in arms:
            # the child starts with it: the allocator is chosen when a process starts
            with mock.patch.dict(os.environ, env):
                figures = in_fresh_process(run_arm, args.config, args.waves, args.groups, args.group_size)
            results.append({"arm": label, **figures})
            print(json.dumps(results[-1]), flush=True)
    print("\n| allocator | wall-clock s | peak resident GB | final GB | session KV at peak GB |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['arm']} | {r['wall_s']} | {r['peak_rss_gb']} | {r['final_rss_gb']} "
            f"| {r['kv_at_peak_gb']} |"
        )
    median = {
        label: {
            k: statistics.median(r[k] for r in results if r["arm"] == label)
            for k in ("wall_s", "peak_rss_gb")
        }
        for label, _ in arms
    }
    base = arms[0][0]
    for label, _ in arms[1:]:
        print(
            f"{label} / {base} (medians of {args.repeats}): wall-clock "
            f"x{median[label]['wall_s'] / median[base]['wall_s']:.2f}, "
            f"peak resident x{median[label]['peak_rss_gb'] / median[base]['peak_rss_gb']:.2f}"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
