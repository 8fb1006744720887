"""The training command line: one training run, then its report.

    python -m selective_rollout.train --config configs/cpu_default.yaml [section.key=value ...]

Starts a local Ray cluster, or joins one given by ``--ray-address`` / ``RAY_ADDRESS`` (what
``ray job submit`` sets), runs the ``Driver`` (selective_rollout/driver/) and writes the run's
report (``analysis.report``), then prints it. Everything a run produces lands in its run folder
(resolved config, metrics.jsonl, rollouts.jsonl, checkpoints, plots, report.md/json). Re-running
with the same ``driver.run_dir`` resumes from the last complete checkpoint (``trainer.resume=auto``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from selective_rollout.analysis.report import report_run
from selective_rollout.config import ConfigError, RunConfig, load_config
from selective_rollout.driver import Driver


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: stop after cleaning up; the run folder stays resumable.

    A ``KeyboardInterrupt`` because Ray's blocking calls turn only that, raised by a signal
    handler, into a clean interruption (they re-raise it as a bare ``KeyboardInterrupt``, so the
    signal's name is also kept in ``_SIGNALS``); any other exception leaves ``ray.get`` with a
    ``SystemError``.
    """


_SIGNALS: list[str] = []  # the signals that interrupted this process, for the closing message


def make_run_dir(cfg: RunConfig) -> Path:
    if cfg.driver.run_dir:
        return Path(cfg.driver.run_dir)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(cfg.driver.runs_dir) / f"{cfg.name}-{stamp}"


def _raise_interrupt(signum: int, frame: Any) -> None:
    _SIGNALS.append(signal.Signals(signum).name)
    raise RunInterrupted(f"received signal {_SIGNALS[-1]}")


def _is_out_of_memory(exc: BaseException) -> bool:
    """A learner micro-batch or an actor that ran out of memory, however Ray wrapped it."""
    from ray.exceptions import OutOfMemoryError

    text = str(exc).lower()
    return isinstance(exc, (MemoryError, OutOfMemoryError)) or "out of memory" in text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default="configs/cpu_default.yaml")
    parser.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (default: RAY_ADDRESS or local)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. gate.tau=0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = make_run_dir(cfg)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    driver = None
    try:
        driver = Driver(cfg, run_dir, args.ray_address)
        driver.run()
        report = report_run(driver)
    except KeyboardInterrupt as exc:  # RunInterrupted included
        why = str(exc) or (f"received signal {_SIGNALS[-1]}" if _SIGNALS else "Ctrl-C")
        print(
            f"interrupted ({why}); {run_dir} is consistent: re-run with "
            f"driver.run_dir={run_dir} to resume from its last checkpoint",
            file=sys.stderr,
        )
        return 130
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not _is_out_of_memory(exc):
            raise
        print(
            f"error: out of memory ({type(exc).__name__}); lower trainer.micro_batch_tokens (now "
            f"{cfg.trainer.micro_batch_tokens}) or rollout.max_groups_in_flight; {run_dir} stays resumable",
            file=sys.stderr,
        )
        return 3
    finally:
        if driver is not None:
            driver.close()
    print(f"run finished: {report}")
    print(report.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
