"""The ``openai`` back-end against this package's own server (SmolLM2 on CPU, loopback): replies
with token ids over both endpoints, stop strings, choices, abort, an unreachable server, its
parameters, and an evaluation over Ray that a training run of it is refused."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from selective_rollout.config import ConfigError, load_config
from selective_rollout.integrations.serve import serve_subprocess
from selective_rollout.rollout.engines import SamplingParams, engine_class
from selective_rollout.rollout.engines.base import (
    TRAINING_NEEDS,
    Completion,
    EngineError,
    capabilities_of,
    missing_capabilities,
)
from selective_rollout.rollout.engines.openai_engine import OpenAIEngine

T = TypeVar("T")
HI = [{"role": "user", "content": "Name three colours."}]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def base_url(smollm2_path):
    with serve_subprocess(smollm2_path) as url:
        yield url


def engine_at(url: str, *overrides: str) -> OpenAIEngine:
    cfg = load_config(None, ["engine.backend=openai", f"engine.base_url={url}", *overrides])
    return OpenAIEngine(cfg.engine, "served-elsewhere")


def with_engine(url: str, use: Callable[[OpenAIEngine], Awaitable[T]]) -> T:
    """``use`` an engine at ``url`` on a fresh event loop, then shut it down."""

    async def scenario() -> T:
        engine = engine_at(url)
        try:
            return await use(engine)
        finally:
            await engine.shutdown()

    return asyncio.run(scenario())


def counter(base_url: str, name: str) -> float:
    """One of the server's Prometheus counters (``GET /metrics``)."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    match = re.search(rf"^selective_rollout_{name}_total (\S+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def test_replies_carry_token_ids_and_logprobs_over_chat_and_token_id_prompts(base_url, smollm2_tokenizer):
    """n > 1 greedy replies agree; a prompt of token ids (what the coordinator sends) is answered as
    its chat messages are; a stop string taken from the greedy reply ends the reply with it."""
    ids = list(
        smollm2_tokenizer.apply_chat_template(HI, add_generation_prompt=True, return_dict=True)["input_ids"]
    )

    async def use(engine: OpenAIEngine) -> tuple[Completion, Completion]:
        greedy = SamplingParams(n=3, max_tokens=12, temperature=0.0)
        return await engine.generate("chat", HI, greedy), await engine.generate("ids", ids, greedy)

    chat, by_ids = with_engine(base_url, use)
    assert [o.index for o in chat.outputs] == [0, 1, 2] and chat.prompt_tokens == len(ids)
    first = chat.outputs[0]
    assert first.token_ids and len(first.logprobs) == len(first.token_ids)
    assert all(lp <= 0 for lp in first.logprobs) and first.finish_reason in ("stop", "length")
    assert smollm2_tokenizer.decode(first.token_ids, skip_special_tokens=True) == first.text
    assert all((o.token_ids, o.text) == (first.token_ids, first.text) for o in chat.outputs + by_ids.outputs)

    stop = first.text.strip()[1:4]  # three characters from inside the greedy reply
    seeded = SamplingParams(n=2, max_tokens=12, temperature=0.0, stop=[stop])
    stopped = with_engine(base_url, lambda e: e.generate("stop", HI, seeded))
    for out in stopped.outputs:
        assert stop in out.text and first.text.startswith(out.text) and out.finish_reason == "stop"
        assert out.token_ids == first.token_ids[: len(out.token_ids)]


def test_choices_go_as_structured_outputs_and_the_reply_is_one_of_them(base_url) -> None:
    options = ["go to desk 1", "open drawer 2"]
    sampling = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=3, choices=options)
    done = with_engine(base_url, lambda e: e.generate("choose", HI, sampling))
    assert all(o.text in options and o.token_ids for o in done.outputs)


def test_abort_ends_an_in_flight_request_and_the_server_aborts_it(base_url) -> None:
    long = SamplingParams(max_tokens=2000, temperature=0.0)
    prompt = [{"role": "user", "content": "Count from 1 to 1000, one number per line."}]

    async def use(engine: OpenAIEngine) -> tuple[Completion, dict]:
        received = counter(base_url, "requests")
        call = asyncio.ensure_future(engine.generate("long", prompt, long))
        while counter(base_url, "requests") == received:  # the server has the request
            await asyncio.sleep(0.05)
        await engine.abort(["long", "never-sent"])
        return await call, await engine.health()

    aborted_before = counter(base_url, "requests_aborted")
    done, health = with_engine(base_url, use)
    assert [(o.finish_reason, o.token_ids) for o in done.outputs] == [("abort", [])]
    assert health["running_requests"] == 0 and health["requests"] == 0
    for _ in range(400):  # the server notices the closed connection
        if counter(base_url, "requests_aborted") > aborted_before:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert counter(base_url, "requests_aborted") == aborted_before + 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_one_error_naming_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = engine_at(url, "engine.served_model=m")
    with pytest.raises(
        EngineError, match=rf"^OpenAI-compatible server at {re.escape(url)}/chat/completions is "
    ):
        asyncio.run(engine.generate("r", HI, GREEDY))


def test_a_server_error_and_a_bad_model_name_are_the_servers_message(base_url) -> None:
    engine = engine_at(base_url, "engine.served_model=gpt-x")
    with pytest.raises(EngineError, match=r"chat/completions answered 404: .*'gpt-x' is not served here"):
        asyncio.run(engine.generate("r", HI, GREEDY))


def test_parameters_are_validated_and_the_key_comes_from_the_environment(monkeypatch) -> None:
    bad = {
        "engine.base_url=127.0.0.1:8000": "engine.base_url",
        "engine.api_key_env=sk-live-123": "engine.api_key_env",
        "engine.max_connections=0": "engine.max_connections",
        "engine.request_timeout_s=0": "engine.request_timeout_s",
    }
    for override, key in bad.items():
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(None, ["engine.backend=openai", override])
    with pytest.raises(ConfigError, match=r"engine\.threads: back-end 'openai' has no such parameter"):
        load_config(None, ["engine.backend=openai", "engine.threads=2"])
    monkeypatch.delenv("SR_TEST_KEY", raising=False)
    with pytest.raises(EngineError, match=r"engine\.api_key_env names SR_TEST_KEY, which is not set"):
        engine_at("http://127.0.0.1:1/v1", "engine.api_key_env=SR_TEST_KEY")
    monkeypatch.setenv("SR_TEST_KEY", "k-1")
    engine = engine_at("http://127.0.0.1:1/v1", "engine.api_key_env=SR_TEST_KEY")
    assert engine.client.http.headers["Authorization"] == "Bearer k-1"
    with pytest.raises(ValueError, match=r"SamplingParams\.n"):
        asyncio.run(engine.generate("r", HI, SamplingParams(n=0)))


def test_the_backend_is_the_core_alone() -> None:
    assert engine_class("openai") is OpenAIEngine and capabilities_of(OpenAIEngine) == []
    assert missing_capabilities([], TRAINING_NEEDS, "openai", "a training run") == (
        "engine.backend=openai lacks weight sync (WeightSync), log-prob probe (LogprobProbe), which a "
        "training run needs; its back-end has only the core (generate, abort, health, shutdown) "
        "(selective_rollout/rollout/engines/base.py)"
    )


@pytest.mark.slow
@pytest.mark.ray
def test_an_evaluation_runs_over_ray_and_a_training_run_is_refused(
    ray_cluster, tiny_games, smollm2_path, base_url
):
    """Engine actors of the back-end serve a held-out evaluation end to end (token-id prompts,
    admissible commands as choices) through the server; the driver's capability check, asked of a
    running engine, refuses a training run in one line."""
    import ray

    from selective_rollout import policy_eval
    from selective_rollout.driver.actors import EngineCapabilityError, RunActors
    from selective_rollout.rollout.engines import create_engines

    cfg = load_config(
        None,
        [
            "engine.backend=openai",
            f"engine.base_url={base_url}",
            "engine.num_cpus=0.5",
            "engine.max_new_tokens=16",
            f"env.games_dir={tiny_games}",
            "env.n_train=6",
            "env.n_valid=2",
            "env.num_workers=1",
            "eval.num_tasks=2",
            "rollout.max_steps=2",
            "gate.k=1",  # the evaluation runs no gate; the run's config still checks it against the cap
        ],
    )
    requests = counter(base_url, "requests")
    summary = policy_eval.run_evaluation(cfg, smollm2_path)
    assert summary["tasks"] == 2 and not summary["failed_tasks"]
    assert counter(base_url, "requests") >= requests + 2  # every task's turns went to the server
    actors = RunActors.__new__(RunActors)  # the check alone, without a learner
    actors.cfg, actors.engines = cfg, create_engines(cfg.engine, smollm2_path, 1)
    try:
        with pytest.raises(EngineCapabilityError) as refused:
            actors.check_capabilities()
    finally:
        ray.get(actors.engines[0].shutdown.remote(), timeout=60)
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(
        "engine.backend=openai lacks weight sync (WeightSync), log-prob probe (LogprobProbe)"
    )
