"""Every bench script and experiment config in its tiny mode, run as the command a record or the
README names (``--tiny``), so that such a command cannot silently stop working.

Bench scripts: each runs as a subprocess with ``--tiny`` and must exit 0 and print what its
measurement prints (its table's header, its JSON keys). Left out: ``gpu_smoke.py`` and
``gpu_smoke_cluster.py``, which need a GPU (tests/launch runs the latter where none is visible);
the vLLM engine of ``engine_throughput.py`` where vllm is not importable (the script reports it
unavailable, and this test checks that it says why).

Experiments: every file of ``configs/experiments/`` has each arm's tiny run config built and
validated (``--tiny --dry-run``); one of them, ``configs/experiments/ab_cpu_seeds.yaml`` (an
``overrides_of`` variant with the offline sweep), trains end to end (``--tiny``) and must write its
report. Every config end to end would take about half an hour on 2 cores, past this directory's
budget of about 10 minutes.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(REPO.glob("configs/experiments/*.yaml"))
END_TO_END = REPO / "configs" / "experiments" / "ab_cpu_seeds.yaml"
EXPERIMENT = "selective_rollout.analysis.experiment"  # the runner's command line (python -m)
# bench scripts that need a GPU, and the shared --tiny helper (no script of its own)
NOT_TINY = {"gpu_smoke.py", "gpu_smoke_cluster.py", "_tiny.py"}


def run(*args: str | Path) -> str:
    """``python ARGS`` from the repository root on a Ray of its own; its stdout, after asserting
    that it exited 0 (else the end of its output is the failure's message)."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, (
        f"{args} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


# each bench script's tiny command after ``bench/<script> --tiny``, and lines its output must hold
BENCH = {
    "gate_overhead.py": ([], ["C lib us", " 16  30 |"]),
    "env_throughput.py": ([], ["steps/s/worker", "tiny     on", "uniform-random win rate, 15 steps, tiny"]),
    "decode_kernels.py": ([], ["sdpa+dynamic", "float32       2    16", "bfloat16      2    16"]),
    "engine_memory.py": ([], ["| allocator |", "| glibc |", "| jemalloc |", "jemalloc / glibc"]),
    "infer_savings.py": ([], ["G=2, gate prefix_edit", "groups 1, fired"]),
    "langgraph_gate.py": ([], ["1 games, gate fired in"]),
    "version_change.py": ([], ["| none |", "| update |", "version change: update - none"]),
    "learner_step.py": ([], ['"zero2_x2"', '"packed_vs_per_step"', '"projection"', '"checksum_ok": true']),
}


@pytest.mark.parametrize("script", sorted(BENCH))
def test_a_bench_script_runs_in_tiny_mode(script: str) -> None:
    args, expected = BENCH[script]
    out = run(f"bench/{script}", "--tiny", *args)
    missing = [line for line in expected if line not in out]
    assert not missing, f"{script} --tiny printed none of {missing}:\n{out[-3000:]}"


def test_engine_throughput_in_tiny_mode_both_ways() -> None:
    out = run("bench/engine_throughput.py", "--tiny")
    assert '"engine": "transformers"' in out and '"engine": "hf_generate"' in out
    if importlib.util.find_spec("vllm") is None:
        assert "vllm: not available here" in out and "not importable" in out
    prefill = run("bench/engine_throughput.py", "--tiny", "--prefill")
    assert "| batch | one at a time | batched | ratio |" in prefill and "| 2 |" in prefill


def test_regime_in_tiny_mode_runs_then_reads_its_log(tmp_path: Path) -> None:
    out = run("bench/regime.py", "--tiny", "--out", tmp_path / "run", f"env.games_dir={tmp_path / 'games'}")
    log = tmp_path / "run" / "rollouts.jsonl"
    assert "zero-variance" in out and "cost:" in out and log.is_file()
    assert "zero-variance" in run("bench/regime.py", "--rollouts", log)


def test_rollout_ab_in_tiny_mode_runs_every_part(tmp_path: Path) -> None:
    out = run("bench/rollout_ab.py", "--tiny", f"env.games_dir={tmp_path / 'games'}")
    for part in ("[1] gate off vs on", "[2] concurrent coordinator", "[3] refill on", "[4] jump-forward"):
        assert part in out


def test_faults_in_tiny_mode_lands_its_kill() -> None:
    """One try of the env and server scenarios (``--tiny``); the env try counts only where the run
    counted the worker it lost."""
    out = run("bench/faults.py", "--tiny")
    for scenario in ("env", "server"):
        assert any(line.startswith(f"{scenario} ") and " 1 of 1 " in line for line in out.splitlines()), out


def test_async_projection_from_the_papers_shares_and_from_a_sync_run(tmp_path: Path) -> None:
    out = run("bench/async_projection.py", "--tiny")
    assert "PROJECTION from the paper's result files" in out and "| 6+2 | 0.7263 | 0.6369 | 1.57x |" in out
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        "engine: {num_engines: 2}\ntrainer: {num_learners: 2}\ndriver: {pipeline: sync}\n"
    )
    rows = [
        {"iteration": i, "rollout/wall_s": 60.0, "train/step_s": 30.0, "system/weight_sync_s": 2.0}
        for i in (0, 1)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in [{"iteration": -1}, *rows]))
    out = run("bench/async_projection.py", "--tiny", "--run", run_dir, "--splits", "2+2,3+1")
    # sync 2+2: 60 + 30 + 2; async 2+2: 2 + max(60, 30); async 3+1: 2 + max(40, 60)
    assert "| 2+2 | 92 | 62 | 1.48x | 50% |" in out and "| 3+1 | 102 | 62 | 1.48x | 100% |" in out


def test_every_bench_script_has_a_tiny_test() -> None:
    covered = {
        *BENCH,
        "engine_throughput.py",
        "regime.py",
        "rollout_ab.py",
        "faults.py",
        "async_projection.py",
    }
    scripts = {p.name for p in (REPO / "bench").glob("*.py")} - NOT_TINY
    assert scripts == covered, f"bench scripts without a tiny test: {sorted(scripts - covered)}"


@pytest.mark.parametrize("config", EXPERIMENTS, ids=lambda p: p.name)
def test_every_arm_of_an_experiment_builds_in_tiny_mode(config: Path, tmp_path: Path) -> None:
    from selective_rollout.analysis.experiment import load_experiment

    out = run("-m", EXPERIMENT, "--config", config, "--tiny", "--dry-run", "--out", tmp_path)
    exp, _ = load_experiment(config)
    planned = [line.split(":")[0] for line in out.splitlines() if line.strip()]
    assert planned == [f"{arm}-s{exp.seeds[0]}" for arm in exp.arms]
    assert all("of 1 groups of G = 2" in line and "'preset': 'tiny'" in line for line in out.splitlines())
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_one_experiment_runs_end_to_end_in_tiny_mode(tmp_path: Path) -> None:
    from selective_rollout.analysis.experiment import load_experiment

    out = run("-m", EXPERIMENT, "--config", END_TO_END, "--tiny", "--out", tmp_path)
    arms = list(load_experiment(END_TO_END)[0].arms)
    with (tmp_path / "experiment.csv").open() as fh:
        assert [(r["arm"], r["seed"]) for r in csv.DictReader(fh)] == [(arm, "0") for arm in arms]
    report = (tmp_path / "experiment.md").read_text()
    assert report in out and all(f"| {arm} |" in report for arm in arms)
    assert (tmp_path / "sweep" / "gate_eval.csv").is_file()
