"""Rollout-engine throughput: tokens/s and time-to-first-token, engines side by side.

For each available engine and G in --groups, on a ~500-token ALFWorld-like prompt with 32 new
tokens, it times the three things a GRPO rollout does:
  first turn  - one request with n=G (the group's shared prompt, nothing cached)
  siblings    - G concurrent n=1 requests with the same prompt and their own sessions
  next turn   - G concurrent requests whose prompts extend turn 1 by a ~60-token observation
                (what per-trajectory KV reuse is for)
plus TTFT (a max_tokens=1 request on a fresh prompt) and, as the lock-step baseline, plain HF
``model.generate`` on G copies of the prompt. Run: ``python bench/engine_throughput.py``.

``--prefill`` measures the transformers engine's prefill alone, batched against one request at a
time (``engine.prefill_batch_size`` 16 vs 1, two engines side by side, arms alternating): B
trajectories each hold a cached ~``--prompt-tokens`` dialogue and send their next turn (a
~``--suffix-tokens`` observation) at once with ``max_tokens=1``, so the timed work is the prefill
of B suffixes over their cached prefixes, what a rollout's engine does each turn; it prints
prefill tokens/s per batch size and the ratio batched / one at a time.

``--tiny`` (either mode) runs G = 2 on a 64-token prompt, or prefill batches of 1 and 2 in fp32:
what CI runs. An engine this machine lacks (vLLM without a GPU) is reported as not available and skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from pathlib import Path

import torch
from _tiny import parse_args

from selective_rollout.config.engine import EngineConfig
from selective_rollout.models import resolve_model
from selective_rollout.rollout.engines import SamplingParams, engine_class

ROOM = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet {i}, "
    "a countertop {i}, a drawer {i}, a fridge {i}, a garbagecan {i}, a microwave {i}, a shelf {i}, "
    "a sinkbasin {i}, a stoveburner {i}, and a toaster {i}."
)


def make_prompt(tokenizer, target_tokens: int, salt: str) -> list[int]:
    """A chat prompt of about ``target_tokens`` tokens; ``salt`` makes it uncached."""
    obs, i = f"[{salt}] ", 1
    while True:
        msgs = [
            {"role": "system", "content": "You are an agent in a household text game."},
            {"role": "user", "content": obs + "\nYour task is to: put a clean mug in the coffeemachine."},
        ]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
        if len(ids) >= target_tokens:
            return list(ids)
        obs += ROOM.format(i=i) + " "
        i += 1


async def bench_engine(engine, tokenizer, g: int, prompt_tokens: int, new_tokens: int, tag: str) -> dict:
    sp = SamplingParams(n=g, max_tokens=new_tokens, temperature=1.0, seed=0)
    one = SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=0)

    p = make_prompt(tokenizer, prompt_tokens, f"ttft-{tag}")
    t = time.perf_counter()
    await engine.generate(f"ttft-{tag}", p, SamplingParams(max_tokens=1))
    ttft = time.perf_counter() - t

    p = make_prompt(tokenizer, prompt_tokens, f"first-{tag}")
    t = time.perf_counter()
    c = await engine.generate(f"first-{tag}", p, sp)
    first_s = time.perf_counter() - t
    first_tokens = sum(len(o.token_ids) for o in c.outputs)

    p = make_prompt(tokenizer, prompt_tokens, f"sib-{tag}")
    t = time.perf_counter()
    sibs = await asyncio.gather(
        *(engine.generate(f"sib-{tag}-{j}", p, one, session_id=f"s-{tag}-{j}") for j in range(g))
    )
    sib_s = time.perf_counter() - t
    sib_tokens = sum(len(c.outputs[0].token_ids) for c in sibs)

    obs = tokenizer(
        "\n<|im_start|>user\nObservation: You open the fridge 1. In it, you see a mug 3, an apple 2 and a "
        "tomato 1.\n\nAdmissible actions:\n- take mug 3 from fridge 1\n- close fridge 1<|im_end|>\n"
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    ).input_ids
    t = time.perf_counter()
    nxt = await asyncio.gather(
        *(
            engine.generate(
                f"next-{tag}-{j}", p + c.outputs[0].token_ids + obs, one, session_id=f"s-{tag}-{j}"
            )
            for j, c in enumerate(sibs)
        )
    )
    next_s = time.perf_counter() - t
    next_tokens = sum(len(c.outputs[0].token_ids) for c in nxt)
    cached = sum(c.cached_prompt_tokens for c in nxt) / max(1, sum(c.prompt_tokens for c in nxt))
    await engine.release([f"s-{tag}-{j}" for j in range(g)])
    return {
        "G": g,
        "prompt_tokens": len(p),
        "ttft_s": round(ttft, 3),
        "first_turn_tok_s": round(first_tokens / first_s, 1),
        "siblings_tok_s": round(sib_tokens / sib_s, 1),
        "next_turn_tok_s": round(next_tokens / next_s, 1),
        "next_turn_cached_frac": round(cached, 3),
    }


def bench_hf_generate(model_path: Path, tokenizer, g: int, prompt_tokens: int, new_tokens: int) -> dict:
    """The lock-step baseline: HF generate on G copies of the prompt, nothing shared or kept."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    p = torch.tensor([make_prompt(tokenizer, prompt_tokens, f"hf-{g}")] * g)
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(p, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True)
    s = time.perf_counter() - t
    return {"G": g, "first_turn_tok_s": round((out.shape[1] - p.shape[1]) * g / s, 1)}


OBSERVATION = (
    "\n<|im_start|>user\nObservation: You arrive at {place}. On the {place}, you see a mug {i}, a "
    "spatula {i}, a saltshaker {i}, a peppershaker {i}, a butterknife {i} and a dishsponge {i}.<|im_end|>"
    "\n<|im_start|>assistant\n"
)


async def bench_prefill(
    engine, tokenizer, batch: int, prompt_tokens: int, suffix_tokens: int, tag: str
) -> dict:
    """B sessions with a cached dialogue each send their next turn together (see the module doc)."""
    one = SamplingParams(max_tokens=1, temperature=1.0, seed=0)
    first = [make_prompt(tokenizer, prompt_tokens, f"{tag}-{j}") for j in range(batch)]
    sessions = [f"pf-{tag}-{j}" for j in range(batch)]
    done = await asyncio.gather(
        *(
            engine.generate(f"{tag}-a{j}", p, one, session_id=sid)
            for j, (p, sid) in enumerate(zip(first, sessions, strict=True))
        )
    )
    nxt = []
    for j, c in enumerate(done):
        obs, places = [], itertools.cycle(["countertop", "diningtable", "shelf", "sidetable"])
        while len(obs) < suffix_tokens:
            obs += tokenizer(
                OBSERVATION.format(place=next(places), i=j + 1), add_special_tokens=False
            ).input_ids
        nxt.append(first[j] + c.outputs[0].token_ids + obs[:suffix_tokens])
    before = await engine.health()
    t = time.perf_counter()
    await asyncio.gather(
        *(
            engine.generate(f"{tag}-b{j}", p, one, session_id=sid)
            for j, (p, sid) in enumerate(zip(nxt, sessions, strict=True))
        )
    )
    s = time.perf_counter() - t
    after = await engine.health()
    await engine.release(sessions)
    prefilled = after["prefilled_tokens"] - before["prefilled_tokens"]
    return {
        "batch": batch,
        "prefilled_tokens": prefilled,
        "forwards": after["prefill_forwards"] - before["prefill_forwards"],
        "prefill_tok_s": round(prefilled / s, 1),
    }


async def prefill_async(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    model_path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    arms = {"one_at_a_time": 1, "batched": 16}
    engines = {}
    for arm, size in arms.items():
        cfg = EngineConfig(
            backend="transformers", dtype=args.dtype, threads=args.threads, prefill_batch_size=size
        )
        engines[arm] = engine_class("transformers")(cfg, model_path)
        await engines[arm].generate(
            "warmup", make_prompt(tokenizer, 64, "warm"), SamplingParams(max_tokens=2)
        )
    rows = []
    for batch in args.prefill_batches:
        speeds: dict[str, list[float]] = {arm: [] for arm in arms}
        for r in range(args.repeats):
            for arm, engine in engines.items():  # alternating, so drift in the machine hits both
                row = await bench_prefill(
                    engine, tokenizer, batch, args.prompt_tokens, args.suffix_tokens, f"{arm}-{batch}-{r}"
                )
                speeds[arm].append(row["prefill_tok_s"])
                print(json.dumps({"arm": arm, **row}))
        best = {arm: statistics.median(v) for arm, v in speeds.items()}
        row = {"batch": batch, **{f"{arm}_tok_s": v for arm, v in best.items()}}
        row["ratio_batched"] = round(best["batched"] / best["one_at_a_time"], 2)
        rows.append(row)
        print(json.dumps(row))
    for engine in engines.values():
        await engine.shutdown()
    shape = f"suffix {args.suffix_tokens} tokens over a cached ~{args.prompt_tokens}-token dialogue"
    print(f"\nprefill tokens/s, medians of {args.repeats} ({shape}, {args.dtype}):")
    print("| batch | one at a time | batched | ratio |\n|---|---|---|---|")
    for row in rows:
        one, both = row["one_at_a_time_tok_s"], row["batched_tok_s"]
        print(f"| {row['batch']} | {one:.0f} | {both:.0f} | x{row['ratio_batched']:.2f} |")
    return {"prefill": rows}


async def main_async(args: argparse.Namespace) -> dict:
    model_path = resolve_model(args.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    results: dict[str, list[dict]] = {}
    for name in args.engines:
        try:
            cls = engine_class(name)
            flags = {"threads": args.threads, "gpu_memory_utilization": args.gpu_mem}
            own = {key: value for key, value in flags.items() if key in cls.Params.model_fields}
            t = time.perf_counter()
            engine = cls(EngineConfig(backend=name, **own), model_path)
            start_s = time.perf_counter() - t
        except Exception as exc:  # an engine this machine lacks is reported, not fatal
            print(f"{name}: not available here ({exc})".splitlines()[0])
            continue
        print(f"{name}: started in {start_s:.1f} s")
        await engine.generate("warmup", make_prompt(tokenizer, 64, "warm"), SamplingParams(max_tokens=4))
        rows = []
        for g in args.groups:
            for r in range(args.repeats):
                row = await bench_engine(
                    engine, tokenizer, g, args.prompt_tokens, args.new_tokens, f"{name}-{g}-{r}"
                )
                row["engine"] = name
                rows.append(row)
                print(json.dumps(row))
        results[name] = rows
        await engine.shutdown()
    if args.hf_baseline:
        results["hf_generate"] = []
        for g in args.groups:
            row = bench_hf_generate(model_path, tokenizer, g, args.prompt_tokens, args.new_tokens)
            row["engine"] = "hf_generate"
            results["hf_generate"].append(row)
            print(json.dumps(row))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--engines", nargs="+", default=["transformers", "vllm"])
    ap.add_argument("--groups", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--prompt-tokens", type=int, default=500)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the transformers engine")
    ap.add_argument("--gpu-mem", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    ap.add_argument("--no-hf-baseline", dest="hf_baseline", action="store_false")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--prefill", action="store_true", help="measure batched vs one-at-a-time prefill only")
    ap.add_argument("--prefill-batches", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--suffix-tokens", type=int, default=40, help="--prefill: new tokens per turn")
    ap.add_argument("--dtype", default="bfloat16", help="--prefill: the engine's dtype (the CPU profile's)")
    sizes = {"groups": [2], "prompt_tokens": 64, "new_tokens": 4, "prefill_batches": [1, 2]}
    args = parse_args(ap, **sizes, suffix_tokens=8, dtype="float32")
    results = asyncio.run(prefill_async(args) if args.prefill else main_async(args))
    results["machine"] = {
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(results["machine"]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
