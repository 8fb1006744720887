"""Metric logging behind one interface: JSONL always, wandb (offline by default), TensorBoard.

Metric names are grouped by prefix (``rollout/``, ``gate/``,
``train/``, ``eval/``, ``system/``), which is what makes wandb's default workspace show one
panel section per group. A back-end that cannot start (wandb not logged in for ``online``,
TensorBoard not installed) is reported once and skipped: the JSONL log is never lost.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from selective_rollout.config.logging import LoggingConfig
from selective_rollout.records import read_jsonl

log = logging.getLogger(__name__)


class MetricSink(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per iteration, flushed at once: the run's source of truth."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()
        }
        self._fh.write(json.dumps({"iteration": step, **clean}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class WandbSink:
    def __init__(self, run_dir: Path, name: str, project: str, mode: str, config: dict[str, Any]) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        try:  # wandb's settings read the working directory
            os.getcwd()
        except FileNotFoundError:  # a Ray job's working copy, unpacked again by a node sharing /tmp
            os.chdir(run_dir)
        self._run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", mode),
            config=config,
            reinit="finish_previous",
        )
        for prefix in ("rollout", "gate", "train", "eval", "system"):
            self._run.define_metric(f"{prefix}/*", step_metric="iteration")
        self._run.define_metric("iteration")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log({"iteration": step, **metrics})

    def close(self) -> None:
        self._run.finish()


class TensorBoardSink:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MetricLogger:
    """Fans each iteration's metrics out to every configured sink."""

    def __init__(self, cfg: LoggingConfig, run_dir: Path, name: str, config: dict[str, Any]) -> None:
        self.sinks: list[MetricSink] = [JsonlSink(run_dir / "metrics.jsonl")]
        factories = {
            "wandb": lambda: WandbSink(run_dir, name, cfg.wandb_project, cfg.wandb_mode, config),
            "tensorboard": lambda: TensorBoardSink(run_dir),
        }
        for backend in cfg.backends:
            if backend == "jsonl" or (backend == "wandb" and cfg.wandb_mode == "disabled"):
                continue
            try:
                self.sinks.append(factories[backend]())
            except Exception as exc:  # a dashboard back-end must never take the run down
                log.warning("metric back-end %s disabled: %s", backend, exc)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The iterations of a metrics.jsonl, in order (a torn last line skipped, see ``read_jsonl``)."""
    return list(read_jsonl(path, _metrics_line, "metrics line"))


def _metrics_line(obj: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(obj.get("iteration"), int):
        raise ValueError("no integer 'iteration'")
    return obj
