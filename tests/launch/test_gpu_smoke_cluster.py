"""``make gpu-smoke-cluster`` on a machine without GPUs: it runs what it can and reports each step
that needs CUDA as SKIP with the count it lacks, never a crash and never a false PASS."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_cluster_smoke_skips_what_needs_gpus_and_checks_the_vllm_release() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "bench/gpu_smoke_cluster.py",
            "--only",
            "vllm-release,one-iteration,tensor-parallel",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    steps = [
        line.split(None, 1) for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))
    ]
    lines = {rest.split(": ", 1)[0]: f"{status} {rest}" for status, rest in steps}
    one = lines["one iteration, vLLM engine + learner on 2 GPUs, NCCL, LoRA"]
    tp = lines["one iteration, tensor parallelism 2 + learner on 3 GPUs"]
    if importlib.util.find_spec("vllm") is None:  # the project's own venv: vLLM is not installed
        assert lines["vLLM is the gpu extra's release"].startswith("SKIP") and "missing vllm" in one
    else:  # .venv-vllm: the release that the gpu extra pins, and no GPU here
        assert lines["vLLM is the gpu extra's release"].startswith("PASS")
        assert "needs 2 CUDA GPUs, 0 visible" in one
    assert one.startswith("SKIP") and tp.startswith("SKIP")
    assert done.returncode == 0 and "0 failed" in done.stdout, done.stdout + done.stderr
