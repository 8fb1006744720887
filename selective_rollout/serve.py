"""An OpenAI-compatible chat server over our TransformersEngine, on loopback.

Lets the inference-time gate (selective_rollout.infer) and any OpenAI client talk to the engines
we already have, exactly as they would talk to ``vllm serve``. Endpoints: ``GET /v1/models`` and
``POST /v1/chat/completions`` (messages, max_tokens / max_completion_tokens, temperature, top_p,
n, seed). A client that disconnects aborts its request in the engine, which is how a gated
sample's generation is cut.

    python -m selective_rollout.serve --model smollm2-135m-instruct --port 0
prints ``listening on http://127.0.0.1:PORT`` once it accepts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from selective_rollout.config.engine import EngineConfig
from selective_rollout.models import resolve_model
from selective_rollout.rollout.engines.base import EngineError, RolloutEngine, SamplingParams

HOST = "127.0.0.1"


class BadRequest(ValueError):
    """A request body the server cannot serve; the message names the field."""


def sampling_from_body(body: dict[str, Any]) -> SamplingParams:
    """OpenAI request fields -> SamplingParams, with one clear error per bad field."""
    try:
        sp = SamplingParams(
            n=int(body.get("n", 1)),
            max_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 64),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            seed=None if body.get("seed") is None else int(body["seed"]),
        )
        sp.validate()
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from None
    return sp


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list")
    for i, m in enumerate(msgs):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise BadRequest(f"messages[{i}] must be an object with string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


class ChatServer:
    """Routes OpenAI chat requests to one engine; request ids are unique per server."""

    def __init__(self, engine: RolloutEngine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name
        self._ids = itertools.count()
        self.aborted = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def chat(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            if body.get("stream"):
                raise BadRequest("stream=true is not supported")
            if body.get("model") not in (None, self.model_name):
                return _error(
                    404, f"model {body.get('model')!r} is not served here; serving {self.model_name!r}"
                )
            messages, sampling = _messages(body), sampling_from_body(body)
        except (BadRequest, ValueError) as exc:
            return _error(400, f"bad chat completion request: {exc}")
        rid = f"chatcmpl-{next(self._ids)}"
        task = asyncio.ensure_future(self.engine.generate(rid, messages, sampling))
        try:
            done = await asyncio.shield(task)
        except asyncio.CancelledError:  # the client went away: free the engine at once
            self.aborted += 1
            await self.engine.abort([rid])
            await asyncio.wait([task])
            raise
        except EngineError as exc:
            return _error(400, str(exc))
        completion_tokens = sum(len(o.token_ids) for o in done.outputs)
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [
                    {
                        "index": o.index,
                        "message": {"role": "assistant", "content": o.text},
                        "finish_reason": o.finish_reason,
                    }
                    for o in done.outputs
                ],
                "usage": {
                    "prompt_tokens": done.prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": done.prompt_tokens + completion_tokens,
                },
            }
        )


async def serve(engine: RolloutEngine, model_name: str, port: int = 0) -> tuple[web.AppRunner, int]:
    """Start serving on 127.0.0.1:port (0 = a free port); returns the runner and the bound port."""
    runner = web.AppRunner(ChatServer(engine, model_name).app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, HOST, port)
    await site.start()
    return runner, runner.addresses[0][1]


@contextlib.contextmanager
def serve_subprocess(model_path: str | Path, name: str = "smollm2", threads: int = 1) -> Iterator[str]:
    """Run this server as a child process on loopback; yields its base URL (``.../v1``) once it
    listens and ends exactly that process (by PID) on exit: for tests, benches and notebooks."""
    cmd = [sys.executable, "-m", "selective_rollout.serve", "--model", str(model_path)]
    cmd += ["--served-model-name", name, "--port", "0", "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        for line in proc.stdout or ():  # the server prints its address once it listens
            if line.startswith("listening on"):
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match is None:
            raise RuntimeError(f"the chat server exited before listening (exit code {proc.poll()})")
        yield f"http://127.0.0.1:{match.group(1)}/v1"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


async def _main(args: argparse.Namespace) -> None:
    from selective_rollout.rollout.engines.transformers_engine import TransformersEngine

    cfg = EngineConfig(model=args.model, threads=args.threads, max_batch_size=args.max_batch_size)
    engine = TransformersEngine(cfg, resolve_model(args.model))
    _, port = await serve(engine, args.served_model_name or args.model, args.port)
    print(f"listening on http://{HOST}:{port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible chat server over the transformers engine")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="alias, local folder or HF id")
    ap.add_argument("--served-model-name", default=None, help="name clients pass as 'model'")
    ap.add_argument("--port", type=int, default=0, help="0 = a free port")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=64)
    asyncio.run(_main(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
