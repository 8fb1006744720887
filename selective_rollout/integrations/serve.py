"""An OpenAI-compatible chat server over the TransformersEngine, on loopback.

Lets the inference-time gate (selective_rollout.integrations.infer) and any OpenAI client talk to
the engines this package already has, exactly as they would talk to ``vllm serve``. Endpoints:
``GET /v1/models``, ``GET /metrics`` (Prometheus: requests, aborted requests, tokens; see
``server_metrics``), ``POST /v1/chat/completions`` (messages, max_tokens / max_completion_tokens,
temperature, top_p, n, seed, stop, stream, stream_options.include_usage) and ``POST /v1/completions``
(a ``prompt`` of token ids, as a trajectory's dialogue is kept; text prompts are refused, since the
engine templates only chat messages). Both also take vLLM's extensions the ``openai`` back-end
sends: ``logprobs`` (the sampled tokens' log-probs, each token written ``token_id:N``),
``return_token_ids`` (each choice's ``token_ids``) and ``structured_outputs.choice`` (the reply is
exactly one of these strings). ``stream=true`` answers with
server-sent events in OpenAI's chunk format (``choices[].delta``, ``finish_reason``, a final
``usage`` chunk when ``include_usage`` is set, ``data: [DONE]``). A client that disconnects,
streaming or not, aborts its request in the engine, which is how a gated sample's generation is
cut. Every field is checked before the engine sees it (one 400 naming it), a prompt longer than
the model's context is refused, and ``ServerLimits`` bounds ``n``, ``max_tokens`` and the tokens
admitted at once (413 for a request that alone exceeds them).

    python -m selective_rollout.integrations.serve --model smollm2-135m-instruct --port 0
prints ``listening on http://127.0.0.1:PORT`` once it accepts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from selective_rollout.config.engine import EngineConfig
from selective_rollout.integrations.server_metrics import ServerMetrics
from selective_rollout.models import resolve_model
from selective_rollout.rollout.engines.base import (
    Completion,
    CompletionOutput,
    EngineError,
    RolloutEngine,
    SamplingParams,
    TextDelta,
)

HOST = "127.0.0.1"


class BadRequest(ValueError):
    """A request body the server cannot serve; the message names the field."""


@dataclass(frozen=True)
class ServerLimits:
    """What one request, and the requests in flight together, may ask of the engine.

    A request's budget is ``n x (prompt tokens + max_tokens)``, the most KV it can grow. One
    over ``max_admitted_tokens`` on its own gets 413; otherwise it waits until the requests in
    flight leave room, so memory stays bounded however many clients arrive at once.
    """

    max_n: int = 16
    max_tokens: int = 2048
    max_admitted_tokens: int = 131072


def _integer(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {value!r}")
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{name}' must be a number, got {value!r}")
    return float(value)


def _stop(body: dict[str, Any]) -> list[str] | None:
    """OpenAI's ``stop``: one string or a list of them. The reply ends with the first it completes,
    which it keeps (as the training engines keep it; an OpenAI server drops it)."""
    stop = body.get("stop")
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
        raise BadRequest(f"'stop' must be a non-empty string or a list of them, got {stop!r}")
    return stops or None


def _choices(body: dict[str, Any]) -> list[str] | None:
    """vLLM's ``structured_outputs: {"choice": [...]}``: the reply is exactly one of these strings."""
    structured = body.get("structured_outputs")
    if structured is None:
        return None
    if not isinstance(structured, dict) or set(structured) != {"choice"}:
        raise BadRequest(f"'structured_outputs' must be an object with only 'choice', got {structured!r}")
    choices = structured["choice"]
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise BadRequest(f"'structured_outputs.choice' must be a non-empty list of strings, got {choices!r}")
    return choices


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false, got {value!r}")
    return value


def sampling_from_body(body: dict[str, Any], limits: ServerLimits = ServerLimits()) -> SamplingParams:
    """OpenAI request fields -> SamplingParams, with one clear error per bad field."""
    max_tokens = _integer(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 64)
    sp = SamplingParams(
        choices=_choices(body),
        n=_integer(body, "n", 1),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        seed=_integer(body, "seed", None),
        stop=_stop(body),
    )
    try:
        sp.validate()
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if sp.n > limits.max_n:
        raise BadRequest(f"'n' is {sp.n}; this server allows at most {limits.max_n} (--max-n)")
    if sp.max_tokens > limits.max_tokens:
        raise BadRequest(f"'max_tokens' is {sp.max_tokens}; this server allows at most {limits.max_tokens}")
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


def _token_ids_prompt(body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        raise BadRequest("'prompt' must be a list of token ids: this server templates only chat messages")
    if not isinstance(prompt, list) or not prompt or not all(_is_int(t) and t >= 0 for t in prompt):
        raise BadRequest("'prompt' must be a non-empty list of token ids")
    return prompt


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stream_options(body: dict[str, Any]) -> bool | None:
    """``None`` for a plain request, else whether the stream ends with a usage chunk."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is None:
        return False if stream else None
    if not stream:
        raise BadRequest("'stream_options' is only allowed with stream=true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise BadRequest(f"'stream_options' must be an object with only 'include_usage', got {options!r}")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise BadRequest(f"'stream_options.include_usage' must be true or false, got {include!r}")
    return include


def _usage(done: Completion) -> dict[str, int]:
    completion_tokens = sum(len(o.token_ids) for o in done.outputs)
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": done.prompt_tokens + completion_tokens,
    }


def _extras(body: dict[str, Any], chat: bool) -> tuple[bool, bool]:
    """Whether the choices carry their log-probs and their token ids. Only the sampled token's own
    log-prob is served: chat's ``logprobs: true`` (``top_logprobs`` 0), completions' ``logprobs: 0``."""
    if chat:
        logprobs = _flag(body, "logprobs")
        if body.get("top_logprobs") not in (None, 0):
            raise BadRequest("'top_logprobs' must be 0: only the sampled token's log-prob is served")
    else:
        logprobs = body.get("logprobs") is not None
        if body.get("logprobs") not in (None, 0):
            raise BadRequest("'logprobs' must be 0 or null: only the sampled token's log-prob is served")
    return logprobs, _flag(body, "return_token_ids")


def _choice(out: CompletionOutput, chat: bool, logprobs: bool, token_ids: bool) -> dict[str, Any]:
    """One output in the endpoint's format; a token is written ``token_id:N`` (vLLM's
    ``return_tokens_as_token_ids``), which names it exactly where a decoded piece may not."""
    choice: dict[str, Any] = {"index": out.index, "finish_reason": out.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": out.text}
    else:
        choice["text"] = out.text
    tokens = [f"token_id:{t}" for t in out.token_ids]
    if logprobs and chat:
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(tokens, out.logprobs, strict=True)
            ]
        }
    elif logprobs:
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": out.logprobs, "top_logprobs": None}
    if token_ids:
        choice["token_ids"] = out.token_ids
    return choice


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


class ChatServer:
    """Routes OpenAI chat requests to one engine; request ids are unique per server.

    ``count_tokens`` gives a request's prompt length for its budget (``ServerLimits``).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        model_name: str,
        count_tokens: Callable[[list[int] | list[dict[str, str]]], int],
        limits: ServerLimits = ServerLimits(),
    ) -> None:
        self.engine, self.model_name = engine, model_name
        self.count_tokens, self.limits = count_tokens, limits
        self._ids = itertools.count()
        self._admitted_tokens = 0
        self._room = asyncio.Condition()
        self.metrics = ServerMetrics()

    @contextlib.asynccontextmanager
    async def _admitted(self, budget: int) -> AsyncIterator[None]:
        cap = self.limits.max_admitted_tokens
        async with self._room:
            await self._room.wait_for(lambda: self._admitted_tokens + budget <= cap)
            self._admitted_tokens += budget
        try:
            yield
        finally:
            async with self._room:
                self._admitted_tokens -= budget
                self._room.notify_all()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/metrics", self.prometheus)
        return app

    @property
    def aborted(self) -> int:
        """Requests aborted because their client went away."""
        return self.metrics.aborted

    async def prometheus(self, request: web.Request) -> web.Response:
        text, content_type = self.metrics.exposition()
        return web.Response(body=text, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def chat(self, request: web.Request) -> web.Response:
        return await self._answer(request, chat=True)

    async def complete(self, request: web.Request) -> web.Response:
        return await self._answer(request, chat=False)

    async def _answer(self, request: web.Request, chat: bool) -> web.Response:
        """One request of either endpoint: chat messages (``chat``) or a prompt of token ids."""
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            include_usage = _stream_options(body)
            if include_usage is not None and not chat:
                raise BadRequest("'stream' is served on /v1/chat/completions only")
            if body.get("model") not in (None, self.model_name):
                return _error(
                    404, f"model {body.get('model')!r} is not served here; serving {self.model_name!r}"
                )
            prompt = _messages(body) if chat else _token_ids_prompt(body)
            sampling = sampling_from_body(body, self.limits)
            extras = _extras(body, chat)
        except (BadRequest, ValueError) as exc:
            return _error(400, f"bad {'chat ' if chat else ''}completion request: {exc}")
        try:
            budget = sampling.n * (self.count_tokens(prompt) + sampling.max_tokens)
        except EngineError as exc:
            return _error(400, str(exc))
        if budget > self.limits.max_admitted_tokens:
            return _error(
                413,
                f"request too large: n x (prompt + max_tokens) = {budget} tokens, over this server's "
                f"{self.limits.max_admitted_tokens} (--max-admitted-tokens)",
            )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        self.metrics.requests.inc()
        if include_usage is not None:
            async with self._admitted(budget):
                return await self._stream(request, rid, prompt, sampling, include_usage)
        async with self._admitted(budget):
            task = asyncio.ensure_future(self.engine.generate(rid, prompt, sampling))
            try:
                done = await asyncio.shield(task)
            except asyncio.CancelledError:  # the client went away: free the engine at once
                self.metrics.aborted_requests.inc()
                await self.engine.abort([rid])
                await asyncio.wait([task])
                raise
            except EngineError as exc:
                return _error(400, str(exc))
        self.metrics.completed(_usage(done))
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [_choice(o, chat, *extras) for o in done.outputs],
                "usage": _usage(done),
            }
        )

    async def _stream(
        self,
        request: web.Request,
        rid: str,
        messages: list[dict[str, str]],
        sampling: SamplingParams,
        include_usage: bool,
    ) -> web.StreamResponse | web.Response:
        """Server-sent events as the engine decodes. The first event is awaited before the
        response starts, so a request the engine refuses still gets its plain 400; an engine
        error later in the stream is sent as an ``error`` event (the status is already out)."""
        created = int(time.time())

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            body = {"id": rid, "object": "chat.completion.chunk", "created": created}
            body |= {"model": self.model_name, "choices": choices, **extra}
            return f"data: {json.dumps(body)}\n\n".encode()

        usage_field = {"usage": None} if include_usage else {}
        events = self.engine.stream(rid, messages, sampling)
        response: web.StreamResponse | None = None
        try:
            try:
                first = await anext(events)
            except EngineError as exc:
                return _error(400, str(exc))
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            role = {"role": "assistant", "content": ""}
            for i in range(sampling.n):
                opening = {"index": i, "delta": role, "finish_reason": None}
                await response.write(chunk([opening], **usage_field))
            event: TextDelta | Completion = first
            while True:
                if isinstance(event, Completion):
                    self.metrics.completed(_usage(event))
                    if include_usage:
                        await response.write(chunk([], usage=_usage(event)))
                    break
                delta = {"content": event.text} if event.text else {}
                choice = {"index": event.index, "delta": delta, "finish_reason": event.finish_reason}
                await response.write(chunk([choice], **usage_field))
                try:
                    event = await anext(events)
                except EngineError as exc:
                    error = {"message": str(exc), "type": "server_error"}
                    await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
                    break
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionResetError):  # the client went away mid-stream
            self.metrics.aborted_requests.inc()
            raise
        finally:
            await events.aclose()  # aborts the request in the engine if it is still running


async def serve(server: ChatServer, port: int = 0) -> tuple[web.AppRunner, int]:
    """Start serving on 127.0.0.1:port (0 = a free port); returns the runner and the bound port."""
    runner = web.AppRunner(server.app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, HOST, port)
    await site.start()
    return runner, runner.addresses[0][1]


@contextlib.contextmanager
def serve_subprocess(model_path: str | Path, name: str = "smollm2", threads: int = 1) -> Iterator[str]:
    """Run this server as a child process on loopback; yields its base URL (``.../v1``) once it
    listens and ends exactly that process (by PID) on exit: for tests, benches and notebooks."""
    cmd = [sys.executable, "-m", "selective_rollout.integrations.serve", "--model", str(model_path)]
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
    limits = ServerLimits(args.max_n, args.max_tokens, args.max_admitted_tokens)
    server = ChatServer(engine, args.served_model_name or args.model, engine.prompt_length, limits)
    _, port = await serve(server, args.port)
    print(f"listening on http://{HOST}:{port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible chat server over the transformers engine")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="alias, local folder or HF id")
    ap.add_argument("--served-model-name", default=None, help="name clients pass as 'model'")
    ap.add_argument("--port", type=int, default=0, help="0 = a free port")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--max-n", type=int, default=ServerLimits.max_n, help="largest 'n' a request may ask")
    ap.add_argument("--max-tokens", type=int, default=ServerLimits.max_tokens, help="largest 'max_tokens'")
    ap.add_argument(
        "--max-admitted-tokens",
        type=int,
        default=ServerLimits.max_admitted_tokens,
        help="n x (prompt + max_tokens) over the requests in flight; one request above it gets 413",
    )
    asyncio.run(_main(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
