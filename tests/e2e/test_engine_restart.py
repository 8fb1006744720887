"""A killed engine is replaced mid-run: the driver over real Ray, the real engine process killed
by PID while it generates, the run finishing with every group accounted for."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from selective_rollout.config import load_config
from selective_rollout.precision import engine_dtype
from selective_rollout.records import Outcome, read_groups
from selective_rollout.reporting.metrics_log import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_an_engine_killed_mid_rollout_is_replaced_and_the_run_finishes(ray_cluster, tiny_games, tmp_path):
    import ray

    from selective_rollout.train import Trainer

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
            "train.iterations=1",
            f"train.run_dir={run_dir}",
            "logging.progress=false",
        ],
    )
    trainer = Trainer(cfg, run_dir)
    killed: list[int] = []

    def kill_the_engine_once_it_generates() -> None:
        pid = ray.get(trainer.engines[0].location.remote())["pid"]
        deadline = time.time() + 600
        while time.time() < deadline:
            if ray.get(trainer.engines[0].health.remote())["generated_tokens"] > 0 and trainer.state["eval"]:
                os.kill(pid, signal.SIGKILL)  # mid-rollout of iteration 0 (after the "before" evaluation)
                killed.append(pid)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_engine_once_it_generates, daemon=True)
    killer.start()
    try:
        report = trainer.run()
        after_engine = ray.get(trainer.engines[0].weights_checksum.remote())
        after_learner = trainer.learner.weights_checksum(engine_dtype(cfg.engine.dtype, "cpu"))
        new_pid = ray.get(trainer.engines[0].location.remote())["pid"]
    finally:
        trainer.close()
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
