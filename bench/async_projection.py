"""A projection, not a measurement: iteration time of a node's engine/learner splits, sync against
async, from component times.

The components of one sync iteration at a reference split of E0 engines and L0 learners: rollout
seconds R, learner seconds T (the optimiser step) and weight-sync seconds S. Either from a sync run
folder (``--run``: the means over its iterations of ``rollout/wall_s``, ``train/step_s`` and
``system/weight_sync_s``, E0 and L0 from its config.yaml), or from the paper's own result files
(the default: rollouts 16,481 of 17,252 s on 4 + 4 GPUs; the rest, 771 s, is taken as learner time
with S = 0, since those files do not split it).

Assumptions, both optimistic for more of a side: the rollout time scales as E0 / E (groups spread
over engines, refill keeping them busy) and the learner time as L0 / L (data parallel, no
communication cost). Then, per iteration:

    sync:   R * E0/E + T * L0/L + S
    async:  S + max(R * E0/E, T * L0/L)      (driver.pipeline=async: the sync is a barrier
                                              between rollouts; the next rollout overlaps training)

Run: python bench/async_projection.py [--run RUN_DIR] [--splits 4+4,6+2,7+1] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from _tiny import parse_args

# the paper's own result files: rollout seconds and all seconds, 4 vLLM GPUs + 4 learner GPUs
PAPER_ROLLOUT_S, PAPER_TOTAL_S, PAPER_SPLIT = 16_481.0, 17_252.0, (4, 4)


@dataclass(frozen=True)
class Components:
    """Seconds per sync iteration at a reference split, and where they came from."""

    rollout_s: float
    learner_s: float
    sync_s: float
    engines: int
    learners: int
    source: str

    def sync_iteration(self, engines: int, learners: int) -> float:
        rollout = self.rollout_s * self.engines / engines
        return rollout + self.learner_s * self.learners / learners + self.sync_s

    def async_iteration(self, engines: int, learners: int) -> float:
        rollout = self.rollout_s * self.engines / engines
        return self.sync_s + max(rollout, self.learner_s * self.learners / learners)


def from_paper() -> Components:
    engines, learners = PAPER_SPLIT
    return Components(
        PAPER_ROLLOUT_S / PAPER_TOTAL_S,
        1.0 - PAPER_ROLLOUT_S / PAPER_TOTAL_S,
        0.0,
        engines,
        learners,
        "the paper's result files, shares of a sync iteration (S taken as 0: not split there)",
    )


def from_run(run_dir: Path) -> Components:
    """The means over a sync run's iterations; refused for an async run, whose rollout overlaps."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    if cfg.get("driver", {}).get("pipeline", "sync") != "sync":
        raise ValueError(f"{run_dir}: an async run's components overlap; project from a sync run")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("iteration", -1) >= 0 and "rollout/wall_s" in r]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl holds no iteration")

    def mean(key: str) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in rows)

    return Components(
        mean("rollout/wall_s"),
        mean("train/step_s"),
        mean("system/weight_sync_s"),
        int(cfg["engine"]["num_engines"]),
        int(cfg["trainer"]["num_learners"]),
        f"{run_dir}: means over {len(rows)} sync iterations, seconds",
    )


def parse_split(text: str) -> tuple[int, int]:
    engines, _, learners = text.partition("+")
    if not (engines.isdigit() and learners.isdigit()) or min(int(engines), int(learners)) < 1:
        raise argparse.ArgumentTypeError(f"split {text!r}: engines+learners, e.g. 6+2")
    return int(engines), int(learners)


def table(parts: Components, splits: list[tuple[int, int]]) -> list[str]:
    reference = parts.sync_iteration(parts.engines, parts.learners)
    lines = [
        f"PROJECTION from {parts.source}: R {parts.rollout_s:.4g}, T {parts.learner_s:.4g}, "
        f"S {parts.sync_s:.4g} at {parts.engines}+{parts.learners}",
        "sync  = R*E0/E + T*L0/L + S;  async = S + max(R*E0/E, T*L0/L)",
        f"| engines+learners | sync iteration | async iteration | vs sync {parts.engines}+{parts.learners} "
        "| learner share busy (async) |",
        "|---|---|---|---|---|",
    ]
    for engines, learners in splits:
        sync, pipelined = parts.sync_iteration(engines, learners), parts.async_iteration(engines, learners)
        busy = parts.learner_s * parts.learners / learners / max(pipelined - parts.sync_s, 1e-12)
        lines.append(
            f"| {engines}+{learners} | {sync:.4g} | {pipelined:.4g} | {reference / pipelined:.2f}x "
            f"| {min(busy, 1.0):.0%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, default=None, help="a sync run folder to take R, T, S from")
    parser.add_argument(
        "--splits",
        type=lambda text: [parse_split(s) for s in text.split(",")],
        default=[(4, 4), (6, 2), (7, 1)],
        help="engines+learners of one node, comma-separated",
    )
    args = parse_args(parser, argv)
    try:
        parts = from_paper() if args.run is None else from_run(args.run)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table(parts, args.splits)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
