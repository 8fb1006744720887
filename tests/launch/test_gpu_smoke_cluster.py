"""``make gpu-smoke-cluster`` where no GPU is visible: each step that needs CUDA is a SKIP naming
what it lacks, a SKIP fails the run unless ``--allow-skip``, and the last line is the count; what
the one-iteration steps assert is checked on constructed metrics lines."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_smoke_cluster import (
    ENGINE_LOGPROB_GAP,
    TP_SIZE,
    iteration_verdict,
    single_gpu_engine,
    tensor_parallel,
    tp_model,
    tp_model_config,
    vllm_release,
)

REPO = Path(__file__).resolve().parents[2]
STEPS = "vllm-release,one-iteration,tensor-parallel"
COUNT = r"^\d+ passed, \d+ failed, \d+ skipped$"


def smoke(*args: str) -> subprocess.CompletedProcess:
    """The cluster smoke with every GPU hidden, so that a GPU machine sees what CI sees."""
    return subprocess.run(
        [sys.executable, "bench/gpu_smoke_cluster.py", "--only", STEPS, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


def step_lines(stdout: str) -> dict[str, str]:
    """Step name -> its whole PASS/FAIL/SKIP line."""
    steps = [line.split(None, 1) for line in stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
    return {rest.split(": ", 1)[0]: f"{status} {rest}" for status, rest in steps}


@pytest.mark.parametrize("allow_skip", [False, True], ids=["skips-fail", "allow-skip"])
def test_the_cluster_smoke_skips_what_needs_gpus_and_says_so_last(allow_skip: bool) -> None:
    done = smoke(*(["--allow-skip"] if allow_skip else []))
    lines = step_lines(done.stdout)
    release, one, tp = (lines[s.step_name] for s in (vllm_release, single_gpu_engine, tensor_parallel))
    if importlib.util.find_spec("vllm") is None:  # the project's own venv: vLLM is not installed
        assert release.startswith("SKIP") and "missing vllm" in one
    else:  # .venv-vllm: the release that the gpu extra pins, and no GPU visible
        assert release.startswith("PASS")
        assert "needs 2 CUDA GPUs, 0 visible" in one and f"needs {TP_SIZE + 1} CUDA GPUs, 0 visible" in tp
    assert one.startswith("SKIP") and tp.startswith("SKIP")
    skipped = [name for name, line in lines.items() if line.startswith("SKIP")]
    last = done.stdout.splitlines()[-1]
    assert last == f"{len(lines) - len(skipped)} passed, 0 failed, {len(skipped)} skipped", done.stdout
    if allow_skip:
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        (verdict,) = [line for line in done.stdout.splitlines() if line.startswith("exit status 1")]
        assert done.returncode == 1 and all(name in verdict for name in skipped), done.stdout


def check_line(**change: float) -> dict[str, float]:
    """The update check's metrics line as the driver logs it, with ``change`` applied."""
    line = {
        "iteration": -1,
        "check/loss": 0.7,
        "check/grad_norm": 1.3,
        "check/served_shift": 0.004,
        "check/served_logprob_gap": 0.003,
    }
    return {**line, **{f"check/{k}": v for k, v in change.items()}}


TRAINED = {
    "iteration": 0,
    "train/loss": 0.1,
    "train/engine_logprob_gap": 0.012,
    "system/served_logprob_gap": 0.002,
}
UNTRAINED = {"iteration": 0, "rollout/groups": 2.0}


def test_the_verdict_prints_every_gap_beside_its_threshold() -> None:
    detail = iteration_verdict([check_line(), TRAINED], served_tol=0.2)
    assert detail == (
        f"engine log-prob gap 0.012 (threshold {ENGINE_LOGPROB_GAP:g}), served-weights probe gap "
        "0.003 (tolerance 0.2), update moved served probe by 0.004 nats (gradient norm 1.3)"
    )


def test_without_a_trained_iteration_the_update_check_alone_proves_the_update() -> None:
    detail = iteration_verdict([check_line(), UNTRAINED], served_tol=0.2)
    assert detail.startswith("engine log-prob gap not measured") and "moved served probe by 0.004" in detail


@pytest.mark.parametrize(
    ("lines", "refusal"),
    [
        ([UNTRAINED], "no update-check line"),
        ([check_line(served_shift=0.0), TRAINED], "the update was not served"),
        ([check_line(grad_norm=0.0), TRAINED], "gradient norm is 0.0"),
        ([check_line(served_logprob_gap=0.5), TRAINED], "served-weights probe gap 0.5 > tolerance 0.2"),
        ([check_line(), {**TRAINED, "system/served_logprob_gap": 0.3}], "probe gap 0.3 > tolerance"),
        ([check_line(), {**TRAINED, "train/engine_logprob_gap": 0.08}], "log-prob gap 0.08 >= 0.05"),
    ],
    ids=["no-check", "not-served", "no-gradient", "check-gap", "iteration-gap", "engine-gap"],
)
def test_the_verdict_refuses_what_the_metrics_do_not_prove(lines: list[dict], refusal: str) -> None:
    with pytest.raises(AssertionError, match=refusal):
        iteration_verdict(lines, served_tol=0.2)


def test_the_tensor_parallel_model_has_head_counts_that_divide_by_the_tp_size() -> None:
    """vLLM shards attention and KV heads across tensor-parallel ranks (SmolLM2-135M's 9 and 3
    do not divide by 2)."""
    cfg = tp_model_config(49152)
    assert cfg.model_type == "qwen2"
    assert cfg.num_attention_heads % TP_SIZE == 0 and cfg.num_key_value_heads % TP_SIZE == 0
    assert cfg.hidden_size % cfg.num_attention_heads == 0


def test_the_tensor_parallel_model_is_a_qwen2_folder_with_smollm2s_tokenizer(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """What the engine and the learner load: a Qwen2 whose vocabulary is SmolLM2's tokenizer, chat
    template included (the agent's prompts)."""
    from transformers import AutoConfig, AutoTokenizer

    out = tp_model(tmp_path / "qwen2-tp")
    cfg, tokenizer = AutoConfig.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert cfg.model_type == "qwen2" and cfg.vocab_size == len(tokenizer)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(smollm2_path).get_vocab()
    assert tokenizer.chat_template and cfg.eos_token_id == tokenizer.eos_token_id
