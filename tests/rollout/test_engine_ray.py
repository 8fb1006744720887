"""The engine as the coordinator sees it: a Ray actor created by ``create_engines``."""

from __future__ import annotations

import asyncio

import pytest

from selective_rollout.config.engine import EngineConfig
from selective_rollout.rollout.engines import SamplingParams, create_engines, engine_class


@pytest.mark.ray
def test_actor_generates_aborts_and_shuts_down(ray_cluster, smollm2_path):
    import ray

    (engine,) = create_engines(EngineConfig(threads=1), smollm2_path, 1)
    msgs = [{"role": "user", "content": "Say hi."}]

    async def go():
        done = await engine.generate.remote("r0", msgs, SamplingParams(n=2, max_tokens=4, seed=0), "s0")
        long = engine.generate.remote("r1", msgs, SamplingParams(max_tokens=1000, choices=["go " * 400]))
        while (await engine.health.remote())["batch_rows"] == 0:
            await asyncio.sleep(0.05)
        await engine.abort.remote(["r1"])
        return done, await long

    try:
        done, aborted = asyncio.run(go())
        assert len(done.outputs) == 2 and all(o.token_ids for o in done.outputs)
        assert aborted.outputs[0].finish_reason == "abort"
        health = ray.get(engine.health.remote())
        assert health["alive"] and health["cached_sessions"] >= 1
        ray.get(engine.shutdown.remote())
    finally:
        ray.kill(engine)


def test_unknown_backend_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown back-end 'sglang'"):
        engine_class("sglang")


def test_vllm_backend_module_imports_without_vllm():
    cls = engine_class("vllm")
    assert cls.__name__ == "VLLMEngine"
