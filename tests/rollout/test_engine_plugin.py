"""An engine back-end added from outside the library: one RolloutEngine subclass with its Params
model and one registration; no change to the config schema or the configuration reference. Built
as create_engines's actors build it, without Ray."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from selective_rollout.config import ConfigError, dump_config, load_config
from selective_rollout.config.engine import EngineConfig
from selective_rollout.config.reference import render
from selective_rollout.rollout.engines import (
    Completion,
    CompletionOutput,
    RolloutEngine,
    SamplingParams,
    check_backend_installed,
    engine_class,
)
from selective_rollout.rollout.engines.base import BACKENDS
from selective_rollout.rollout.engines.params import BackendParams
from tests.rollout.test_strategy_plugin import assert_refused_in_one_line

ROOT = Path(__file__).resolve().parents[2]
TOY = "canned_test_only"


class CannedParams(BackendParams):
    reply: str = Field("look", description="what the engine answers every request with")


class CannedEngine(RolloutEngine):
    """Answers every request with the same reply (a toy: no model, no weights): the core alone,
    no capability."""

    Params = CannedParams

    def __init__(self, cfg: EngineConfig, model_path: str | Path) -> None:
        self.params = cfg.params_for(CannedParams)
        self.cfg, self.model_path = cfg, str(model_path)

    async def generate(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None = None,
    ) -> Completion:
        outputs = [CompletionOutput(i, [1], [0.0], self.params.reply, "stop") for i in range(sampling.n)]
        return Completion(request_id, len(prompt), 0, outputs)

    async def abort(self, request_ids: list[str]) -> None:
        """Nothing runs long enough to abort."""

    async def health(self) -> dict[str, Any]:
        return {"backend": TOY}

    async def shutdown(self) -> None:
        """Nothing to free."""


@pytest.fixture
def toy_backend():
    BACKENDS.add(TOY, f"{__name__}:CannedEngine")
    try:
        yield CannedEngine
    finally:
        BACKENDS.remove(TOY)


def test_config_selects_the_toy_and_validates_its_own_parameter(toy_backend, tmp_path):
    cfg = load_config(None, [f"engine.backend={TOY}", "engine.reply=go to desk 1", "engine.temperature=0"])
    assert (cfg.engine.backend, cfg.engine.reply, cfg.engine.temperature) == (TOY, "go to desk 1", 0.0)
    assert load_config(None, [f"engine.backend={TOY}"]).engine.reply == "look"  # its default
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            [f"engine.backend={TOY}", "engine.threads=2"],
            rf"engine\.threads: back-end '{TOY}' has no such parameter \(transformers has\)",
        ),
        (["engine.reply=x"], rf"engine\.reply: back-end 'transformers' has no such parameter \({TOY} has\)"),
        (
            ["engine.backend=vllm", "engine.threads=2"],
            r"engine\.threads: back-end 'vllm' has no such parameter \(transformers has\)",
        ),
        (
            ["engine.tensor_parallel_size=2"],
            r"engine\.tensor_parallel_size: back-end 'transformers' has no such parameter \(vllm has\)",
        ),
        ([f"engine.backend={TOY}", "engine.rpely=x"], r"engine\.rpely: unknown key"),
        ([f"engine.backend={TOY}", "engine.reply=null"], r"engine\.reply: Input should be a valid string"),
        (["engine.backend=sglang"], r"engine\.backend: unknown back-end 'sglang'; known: "),
    ],
)
def test_config_refuses_keys_the_selected_backend_does_not_own(toy_backend, overrides, match):
    assert_refused_in_one_line(overrides, match)


def test_the_engine_is_built_from_the_config_as_create_engines_builds_it(toy_backend):
    cfg = load_config(None, [f"engine.backend={TOY}", "engine.reply=open drawer 1"])
    check_backend_installed(TOY)  # it requires no library
    # create_engines starts ray.remote(engine_class(cfg.backend)) with (cfg, str(model_path))
    engine = engine_class(cfg.engine.backend)(cfg.engine, "/no/model")
    assert isinstance(engine, CannedEngine) and engine.params.reply == "open drawer 1"
    out = asyncio.run(engine.generate("r0", [1, 2, 3], SamplingParams(n=2)))
    assert [o.text for o in out.outputs] == ["open drawer 1", "open drawer 1"]


def test_registration_refuses_a_name_twice_a_bad_target_and_a_missing_library(toy_backend):
    with pytest.raises(ValueError, match=f"back-end '{TOY}' is registered twice"):
        BACKENDS.add(TOY, f"{__name__}:CannedEngine")
    with pytest.raises(ValueError, match="target must be 'module:Class'"):
        BACKENDS.add("dotted_test_only", f"{__name__}.CannedEngine")
    BACKENDS.add("not_an_engine_test_only", f"{__name__}:CannedParams", requires="no_such_library_test_only")
    try:
        with pytest.raises(TypeError, match="is not a RolloutEngine subclass"):
            engine_class("not_an_engine_test_only")
    finally:
        BACKENDS.remove("not_an_engine_test_only")
    BACKENDS.add("missing_test_only", f"{__name__}:CannedEngine", requires="no_such_library_test_only")
    try:
        with pytest.raises(ValueError, match="no_such_library_test_only is not installed"):
            check_backend_installed("missing_test_only")
    finally:
        BACKENDS.remove("missing_test_only")


@pytest.mark.parametrize(
    "recipe",
    [
        "alfworld_qwen2.5_7b_grpo.yaml",
        "alfworld_qwen2.5_7b_grpo_async.yaml",
        "alfworld_qwen2.5_7b_multinode.yaml",
        "alfworld_qwen2.5_7b_2node.yaml",
    ],
)
def test_the_gpu_recipes_bind_vllms_own_keys_without_importing_vllm(recipe):
    cfg = load_config(ROOT / "configs" / recipe)
    assert cfg.engine.backend == "vllm" and cfg.engine.dtype == "bfloat16"
    params = cfg.engine.params_for(engine_class("vllm").Params)
    assert params.enable_prefix_caching and params.tensor_parallel_size >= 1
    assert "threads" not in (cfg.engine.model_extra or {})
    if importlib.util.find_spec("vllm") is None:
        assert "vllm" not in sys.modules


def test_switching_backend_over_a_profile_drops_the_profiles_keys_of_the_replaced_one():
    profile = ROOT / "configs" / "cpu_default.yaml"
    assert load_config(profile).engine.threads == 2
    cfg = load_config(profile, ["engine.backend=vllm", "engine.tensor_parallel_size=1"])
    assert set(cfg.engine.model_extra or {}) == set(engine_class("vllm").Params.model_fields)
    assert cfg.engine.dtype == "bfloat16-if-native"  # shared keys of the profile stay
    with pytest.raises(ConfigError, match=r"engine\.threads: back-end 'vllm' has no such parameter"):
        load_config(profile, ["engine.backend=vllm", "engine.threads=2"])


def test_the_reference_lists_each_backends_keys(toy_backend):
    doc = render()
    assert f"### `engine.backend: {TOY}`" in doc and '| `engine.reply` | `str` | `"look"` |' in doc
    assert (
        "### `engine.backend: vllm`" in doc
        and "| `engine.tensor_parallel_size` | `int` | `1` | >= 1 |" in doc
    )


def test_a_backend_of_the_core_alone_is_named_for_what_training_lacks(toy_backend):
    """The core (generate, abort, health, shutdown) makes a back-end; training needs weight sync
    and the served-weights probe, and the driver names what is missing in one line."""
    from selective_rollout.rollout.engines.base import TRAINING_NEEDS, capabilities_of, missing_capabilities

    cfg = load_config(None, [f"engine.backend={TOY}"])
    engine = CannedEngine(cfg.engine, "/no/model")
    have = asyncio.run(engine.capabilities())
    assert have == [] and asyncio.run(engine.release(["s"])) is None
    problem = missing_capabilities(have, TRAINING_NEEDS, TOY, "a training run")
    assert problem == (
        f"engine.backend={TOY} lacks weight sync (WeightSync), log-prob probe (LogprobProbe), which a "
        "training run needs; its back-end has only the core (generate, abort, health, shutdown) "
        "(selective_rollout/rollout/engines/base.py)"
    )
    # the shipped back-ends have every capability (their classes read without vLLM installed)
    for backend in ("transformers", "vllm"):
        assert capabilities_of(engine_class(backend)) == ["weight sync", "log-prob probe", "cache control"]
    assert (
        missing_capabilities(capabilities_of(engine_class("transformers")), TRAINING_NEEDS, "t", "x") is None
    )


@pytest.mark.slow
@pytest.mark.ray
def test_a_core_only_backend_evaluates_over_ray_and_says_what_training_lacks(
    ray_cluster, tiny_games, smollm2_path
):
    """Named by its path (every process finds it), the canned back-end serves a held-out evaluation
    end to end (engines, coordinator, env workers; its replies are legal commands that never win),
    and a running engine of it reports no capability, which the driver's check turns into one line."""
    import ray

    from selective_rollout.analysis.policy_eval import run_evaluation
    from selective_rollout.rollout.engines import create_engines
    from selective_rollout.rollout.engines.base import TRAINING_NEEDS, missing_capabilities

    backend = f"{__name__}:CannedEngine"
    cfg = load_config(
        None,
        [
            f"engine.backend={backend}",
            "engine.num_cpus=0.5",
            f"env.games_dir={tiny_games}",
            "env.n_train=6",
            "env.n_valid=2",
            "env.num_workers=1",
            "eval.num_tasks=2",
            "rollout.max_steps=2",
            "gate.k=1",  # the evaluation runs no gate; the run's config still checks it against the cap
        ],
    )
    summary = run_evaluation(cfg, smollm2_path)
    assert summary["tasks"] == 2 and summary["success_rate"] == 0.0 and not summary["failed_tasks"]
    (engine,) = create_engines(cfg.engine, smollm2_path, 1)
    try:
        have = ray.get(engine.capabilities.remote(), timeout=120)
    finally:
        ray.get(engine.shutdown.remote(), timeout=60)
    assert have == []
    assert "lacks weight sync (WeightSync), log-prob probe (LogprobProbe)" in missing_capabilities(
        have, TRAINING_NEEDS, backend, "a training run"
    )
