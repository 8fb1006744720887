"""wandb offline beside metrics.jsonl, also when the driver's working directory is gone."""

from __future__ import annotations

import os
from pathlib import Path

from selective_rollout.config.logging import LoggingConfig
from selective_rollout.reporting.metrics_log import MetricLogger, WandbSink, read_metrics


def test_wandb_starts_when_the_working_directory_was_replaced(tmp_path: Path, monkeypatch) -> None:
    """A Ray job's driver runs in Ray's copy of the checkout; a second node on the same machine
    unpacks that copy again (deleting the first), and wandb's settings read the working directory:
    it must log all the same, not be disabled."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    gone = tmp_path / "job-working-copy"
    gone.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    gone.rmdir()
    try:
        logger = MetricLogger(LoggingConfig(backends=["jsonl", "wandb"]), run_dir, "r", {"seed": 0})
        assert any(isinstance(sink, WandbSink) for sink in logger.sinks)
        logger.log({"train/loss": 1.5}, 0)
        logger.close()
    finally:
        os.chdir(here)
    assert [m["train/loss"] for m in read_metrics(run_dir / "metrics.jsonl")] == [1.5]
    assert any((run_dir / "wandb").glob("offline-run-*"))
