"""A/B experiments: arms x seeds on identical task streams, with paired bootstrap CIs.

    python -m selective_rollout.analysis.experiment --config configs/experiments/ab_cpu.yaml \\
        [--out DIR] [--tiny] [--dry-run] [--seeds 0,1] [--arms off,on]

Every arm is a full training run (the driver, in this process, over one Ray cluster) from the
same base config plus the arm's overrides. For a given seed every arm sees the same task
stream (``driver.task_shuffle_seed`` = seed), the same warm start and the same held-out tasks,
so per-seed differences between arms are paired. Writes ``experiment.csv`` (one row per arm and
seed), ``experiment.md`` (per-arm means; per pair the mean difference with a 95% bootstrap CI over
seeds, the paper's protocol; the held-out change pooled over seeds, its CI over tasks) and
``experiment.png``; then pools every arm's rollouts for the offline K x tau gate sweep
(``sweep/gate_eval.csv`` and ``sweep/gate_pareto.png``).

``--tiny`` trains every arm on the first seed at the smallest size (``TINY_RUN``) and writes the
same outputs in minutes; ``--dry-run`` builds and validates every run's config and trains nothing.
CI runs both (tests/bench), so that an experiment's command cannot silently stop working.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from selective_rollout.analysis.experiment.runs import plan_experiment, run_experiment
from selective_rollout.config import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.analysis.experiment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", required=True, help="experiment YAML, e.g. configs/experiments/ab_cpu.yaml"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="every arm on the first seed at the smallest size (tiny games, G = 2, one iteration; "
        "default folder runs/experiment-<name>-tiny): checks the command works, in minutes",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build and validate every run's config, print one line per run, train nothing",
    )
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(x) for x in text.split(",")],
        default=None,
        help="comma-separated: run only these of the file's seeds (the outputs cover them); a later "
        "run of more seeds into the same folder reads these runs back instead of training them again",
    )
    parser.add_argument(
        "--arms",
        type=lambda text: text.split(","),
        default=None,
        help="comma-separated: run only these of the file's arms, at least two, the first kept in "
        "the file's order being the reference; the outputs cover them, and runs already in the "
        "folder are read back as with --seeds",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.dry_run:
            print("\n".join(plan_experiment(args.config, args.out, args.tiny, args.seeds, args.arms)))
            return 0
        report = run_experiment(args.config, args.out, args.tiny, args.seeds, args.arms)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.read_text())
    return 0
