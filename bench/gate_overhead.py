"""Gate overhead: microseconds per gate decision, C library vs pure Python vs incremental tracker.

A decision at step K over G trajectories is what the coordinator pays per group per check. We
print it for G in {8, 16} and K in {10, 30} and as a share of one rollout step. The reference
step is deliberately the cheapest part of a step, the ALFWorld environment step alone (0.12 s
measured on a 2-core CPU), so the percentage is an upper bound: a real step adds an
LLM generation on top. Override it with --step-s.

Run: python bench/gate_overhead.py [--step-s 0.12] [--repeats 200] [--tiny]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from _tiny import parse_args

from selective_rollout.gate import DivergenceTracker, PrefixEditGate, levenshtein_py, prefix_edit_distance
from selective_rollout.gate.base import GroupView

ACTIONS = [f"go to cabinet {i}" for i in range(1, 12)] + [
    "take pan 1 from stoveburner 1",
    "open fridge 1",
    "look",
]


def make_group(g: int, k: int, rng: random.Random) -> list[list[str]]:
    """Trajectories that share a random-length prefix and then diverge, like a real group."""
    shared = [rng.choice(ACTIONS) for _ in range(k)]
    return [shared[: rng.randint(0, k)] + [rng.choice(ACTIONS) for _ in range(k)] for _ in range(g)]


def time_us(fn: Callable[[], object], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def tracker_step_us(group: list[list[str]], k: int, repeats: int) -> float:
    """Incremental cost of one step: every trajectory appends its K-th action, then D_K is read."""
    total = 0.0
    for _ in range(repeats):
        tracker = DivergenceTracker(len(group))
        for step in range(k - 1):
            for i, seq in enumerate(group):
                tracker.append(i, seq[step])
        start = time.perf_counter()
        for i, seq in enumerate(group):
            tracker.append(i, seq[k - 1])
        tracker.distance(k)
        total += time.perf_counter() - start
    return total / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--step-s", type=float, default=0.12, help="reference rollout step time (s)")
    parser.add_argument("--repeats", type=int, default=200)
    args = parse_args(parser, repeats=5)
    rng = random.Random(0)
    header = (
        f"{'G':>3} {'K':>3} | {'C lib us':>9} {'Python us':>10} {'speed-up':>8} | "
        f"{'tracker us/step':>15} | {'C % of step':>11}"
    )
    print(f"reference step: {args.step_s * 1000:.0f} ms (ALFWorld env step alone; LLM time not included)")
    print(header)
    print("-" * len(header))
    for g in (8, 16):
        for k in (10, 30):
            group = make_group(g, k, rng)
            gate = PrefixEditGate(k=k, tau=0.12)
            state = GroupView(group, step=k)
            c_us = time_us(lambda gate=gate, state=state: gate.decide(state), args.repeats)
            py_us = time_us(
                lambda group=group, k=k: prefix_edit_distance(group, k, lev=levenshtein_py),
                max(args.repeats // 10, 5),
            )
            tr_us = tracker_step_us(group, k, max(args.repeats // 10, 5))
            share = c_us / (args.step_s * 1e6) * 100
            speedup = py_us / c_us
            cells = f"{c_us:>9.1f} {py_us:>10.1f} {speedup:>7.1f}x | {tr_us:>15.1f} | {share:>10.3f}%"
            print(f"{g:>3} {k:>3} | {cells}")


if __name__ == "__main__":
    main()
