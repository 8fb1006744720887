"""A killed engine is replaced mid-run: the driver over real Ray, the real engine process killed
by PID while it generates, the run finishing with every group accounted for."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from selective_rollout.analysis.report import report_run
from selective_rollout.config import load_config
from selective_rollout.precision import engine_dtype
from selective_rollout.records import Outcome, read_groups
from selective_rollout.reporting.metrics_log import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_an_engine_killed_mid_rollout_is_replaced_and_the_run_finishes(ray_cluster, tiny_games, tmp_path):
    import ray

    from selective_rollout.driver import Driver

    run_dir = tmp_path / "run"
    cfg = load_config(
        "configs/cpu_default.yaml",
        [
            f"env.games_dir={tiny_games}",
            "env.preset=tiny",  # the tiny_games fixture (the profile plays medium games)
            "env.n_train=6",
            "env.n_valid=2",
            "env.num_workers=1",
            "rollout.group_size=2",
            "rollout.groups_per_iteration=2",
            "rollout.max_groups_in_flight=1",
            "rollout.max_steps=4",
            "rollout.strategy=none",
            "engine.temperature=1.0",
            "warm_start.enabled=false",
            "eval.num_tasks=1",
            "driver.iterations=1",
            f"driver.run_dir={run_dir}",
            "logging.progress=false",
        ],
    )
    driver = Driver(cfg, run_dir)
    killed: list[int] = []

    def kill_the_engine_once_it_generates() -> None:
        """Kill it mid-rollout of iteration 0: once it generates beyond what the "before" evaluation
        took (a kill right after the evaluation could land before the rollout starts)."""
        pid = ray.get(driver.engines[0].location.remote())["pid"]
        deadline = time.time() + 600
        evaluated_tokens = None
        while time.time() < deadline:
            evaluated = bool(driver.state["eval"])  # read first: the tokens below then include the eval's
            tokens = ray.get(driver.engines[0].health.remote())["generated_tokens"]
            if evaluated_tokens is None and evaluated:
                evaluated_tokens = tokens
            elif evaluated_tokens is not None and tokens > evaluated_tokens:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_engine_once_it_generates, daemon=True)
    killer.start()
    try:
        driver.run()
        report = report_run(driver)
        after_engine = ray.get(driver.engines[0].weights_checksum.remote())
        after_learner = driver.learner.weights_checksum(engine_dtype(cfg.engine.dtype, "cpu"))
        new_pid = ray.get(driver.engines[0].location.remote())["pid"]
    finally:
        driver.close()
    killer.join(timeout=5)
    assert killed and new_pid != killed[0]
    (metrics,) = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["iteration"] == 0]
    assert metrics["system/engine_restarts"] == 1.0
    groups = list(read_groups(run_dir / "rollouts.jsonl"))
    failed = [g for g in groups if g.outcome is Outcome.FAILED]
    assert failed and all("engine 0 died" in g.meta["failure"] for g in failed)
    # every failed group was retried on the replacement: the batch still reached its target
    assert sum(g.outcome is Outcome.COMPLETED for g in groups) == 2
    assert after_engine == pytest.approx(after_learner, rel=1e-9)  # the replacement got every update
    assert report.is_file()
