"""The transformers engine's decode step, kernel by kernel, side by side (docs/engines.md).

One decode step of a left-padded batch (the engine's layout: a padding mask, a KV cache that grows
by one token) for the rollout model, timed with transformers' own SDPA attention and
``DynamicCache`` (which repeat the KV heads and copy the cache on every token) against the
engine's grouped-query attention and in-place ``GrowingCache``, in fp32 and bf16, at the batch
sizes and KV lengths of the CPU profile's rollouts (``--shapes``). Prints ms per step and the ratios.

    python bench/decode_kernels.py [--model smollm2-135m-instruct] [--steps 8] [--shapes 8x200 ...]

``--tiny`` (what CI runs): one step of a batch of 2 over 16 tokens.
"""

from __future__ import annotations

import argparse
import time

import torch
from _tiny import parse_args
from transformers import AutoModelForCausalLM, DynamicCache

from selective_rollout.models import resolve_model
from selective_rollout.rollout.engines import grouped_attention
from selective_rollout.rollout.engines.growing_cache import GrowingCache


@torch.inference_mode()
def step_ms(model, cache_cls, batch: int, kv_len: int, steps: int) -> float:
    """Mean ms per decode step over ``steps`` tokens after a ``kv_len`` prompt (first step untimed)."""
    ids = torch.randint(0, 1000, (batch, kv_len))
    mask = torch.ones(batch, kv_len, dtype=torch.long)
    mask[: batch // 2, : kv_len // 4] = 0  # half the rows left-padded, as in a mixed batch
    cache = cache_cls()
    model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    times = []
    for _ in range(steps + 1):
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], dim=1)
        start = time.perf_counter()
        model(input_ids=torch.randint(0, 1000, (batch, 1)), attention_mask=mask, past_key_values=cache)
        times.append(time.perf_counter() - start)
    return 1000 * sum(times[1:]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--shapes", nargs="+", default=["8x200", "32x200", "32x400"], help="BATCHxKV_LENGTH per row"
    )
    args = parse_args(parser, steps=1, shapes=["2x16"])
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model, None)
    print(f"model {args.model}, {args.threads} threads, ms per decode step (mean of {args.steps})")
    print(f"{'dtype':<9} {'batch':>5} {'kv':>5} {'sdpa+dynamic':>13} {'grouped+growing':>16} {'ratio':>6}")
    for dtype in ("float32", "bfloat16"):
        ref = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        )
        ours = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation=grouped_attention.register()
        )
        for batch, kv_len in (map(int, shape.split("x")) for shape in args.shapes):
            a = step_ms(ref.eval(), DynamicCache, batch, kv_len, args.steps)
            b = step_ms(ours.eval(), GrowingCache, batch, kv_len, args.steps)
            print(f"{dtype:<9} {batch:>5} {kv_len:>5} {a:>13.1f} {b:>16.1f} {a / b:>5.2f}x")


if __name__ == "__main__":
    main()
