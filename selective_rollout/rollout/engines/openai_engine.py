"""A back-end over any OpenAI-compatible server: rollouts and evaluation served by someone else.

``OpenAIClient`` is the one place in the package that speaks the protocol (``POST
chat/completions`` for chat messages, ``POST completions`` for a prompt of token ids, ``GET
models``); the back-end and the inference-time integrations (``integrations.agent_loop``) share it.
The server holds the weights, so the back-end is the core alone: no weight sync (no training), no
log-prob probe, no cache control.

What a reply carries depends on the server. Asked with ``token_detail``, a request also sends
``logprobs`` and vLLM's ``return_token_ids`` and ``include_stop_str_in_output`` (this package's
``serve`` takes them too): a reply's ``token_ids`` come from the choice's ``token_ids``, else from
log-prob entries written ``token_id:N``; its ``logprobs`` from the log-prob entries, else empty. A
token-id prompt (what the rollout coordinator sends, since it keeps each dialogue as tokens) needs
the reply's ids back to extend the dialogue, so a server that returns none is one clear error;
a chat prompt's reply then has empty ``token_ids``. ``choices`` are sent as vLLM's
``structured_outputs.choice`` (``serve`` takes it too); a server without it refuses the request,
which comes back as the server's own message.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from selective_rollout.rollout.engines.base import (
    BusyClock,
    Completion,
    CompletionOutput,
    EngineError,
    FinishReason,
    RolloutEngine,
    SamplingParams,
)
from selective_rollout.rollout.engines.params import OpenAIParams

if TYPE_CHECKING:
    from selective_rollout.config.engine import EngineConfig

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids; serve writes tokens so


@dataclass
class Answer:
    """A reply and what the server says it cost (``completion_tokens`` counts tokens even when the
    server returns no token ids)."""

    completion: Completion
    completion_tokens: int


class OpenAIClient:
    """Requests to one server's OpenAI API root (``base_url``, e.g. ``http://127.0.0.1:8000/v1``).

    Every failure is an ``EngineError`` naming the URL: a server that cannot be reached, one
    that answers with an error status (its message quoted), a body without choices. ``http``: an
    httpx client of the caller's (its base URL is the server's root), closed by the caller.
    """

    def __init__(
        self,
        base_url: str = "",
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 64,
        token_detail: bool = False,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.token_detail = token_detail
        self._owned = http is None
        if http is None:
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
            http = httpx.AsyncClient(
                base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout_s, limits=limits
            )
        self.http = http
        self.base_url = str(http.base_url).rstrip("/")

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owned:
            await self.http.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.base_url}/{path}"
        try:
            resp = await self.http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise EngineError(
                f"OpenAI-compatible server at {url} is unreachable: {type(exc).__name__}: {exc}"
            ) from None
        if resp.status_code != 200:
            raise EngineError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
        try:
            data = resp.json()
        except ValueError:
            raise EngineError(f"{url} answered with a body that is not JSON: {resp.text[:300]}") from None
        if not isinstance(data, dict):
            raise EngineError(f"{url} answered with {str(data)[:300]}, not a JSON object")
        return data

    async def models(self) -> list[str]:
        """The ids of the models the server serves."""
        data = await self._call("GET", "models")
        return [m["id"] for m in data.get("data") or [] if isinstance(m, dict) and "id" in m]

    def body(self, prompt: list[int] | list[dict], sampling: SamplingParams, model: str | None) -> dict:
        """The request for ``prompt`` under ``sampling`` (see the module's docstring for the fields
        beyond OpenAI's own)."""
        chat = _is_chat(prompt)
        body: dict[str, Any] = {"messages" if chat else "prompt": prompt, "max_tokens": sampling.max_tokens}
        body |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "n": sampling.n}
        if model is not None:
            body["model"] = model
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.choices:
            body["structured_outputs"] = {"choice": list(sampling.choices)}
        elif sampling.stop:
            body["stop"] = list(sampling.stop)
            if self.token_detail:  # the reply keeps its stop string, as the training engines' do
                body["include_stop_str_in_output"] = True
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if self.token_detail:
            body |= {"logprobs": True if chat else 0, "return_token_ids": True}
        return body

    async def generate(
        self, request_id: str, prompt: list[int] | list[dict], sampling: SamplingParams, model: str | None
    ) -> Answer:
        """One request, its reply as a ``Completion`` (outputs in index order)."""
        if not prompt:
            raise EngineError(f"request {request_id}: empty prompt")
        chat = _is_chat(prompt)
        path = "chat/completions" if chat else "completions"
        data = await self._call("POST", path, self.body(prompt, sampling, model))
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise EngineError(f"{self.base_url}/{path} returned no choices: {str(data)[:300]}")
        try:
            outputs = sorted((_output(pos, c, chat) for pos, c in enumerate(choices)), key=lambda o: o.index)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EngineError(
                f"{self.base_url}/{path} returned a choice this client cannot read ({exc!r}): "
                f"{str(data)[:300]}"
            ) from None
        if not chat and any(not o.token_ids for o in outputs):
            raise EngineError(
                f"request {request_id}: {self.base_url} returned no token ids, which a token-id prompt "
                "needs to extend its dialogue (vLLM >= 0.10.2 and this package's serve return them "
                "for return_token_ids)"
            )
        usage = data.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        prompt_tokens = int(usage.get("prompt_tokens") or (0 if chat else len(prompt)))
        spent = int(usage.get("completion_tokens") or sum(len(o.token_ids) for o in outputs))
        return Answer(Completion(request_id, prompt_tokens, int(cached), outputs), spent)


def _is_chat(prompt: list[int] | list[dict]) -> bool:
    return bool(prompt) and isinstance(prompt[0], dict)


def _output(position: int, choice: dict[str, Any], chat: bool) -> CompletionOutput:
    """One choice of either endpoint as a ``CompletionOutput`` (see the module's docstring)."""
    text = (choice["message"].get("content") if chat else choice.get("text")) or ""
    logprobs = choice.get("logprobs") or {}
    if chat:
        entries = logprobs.get("content") or []
        tokens, lps = [e.get("token", "") for e in entries], [float(e["logprob"]) for e in entries]
    else:
        tokens = logprobs.get("tokens") or []
        lps = [float(x) for x in logprobs.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None and tokens and all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        ids = [int(t.removeprefix(TOKEN_ID_PREFIX)) for t in tokens]
    return CompletionOutput(
        int(choice.get("index", position)),
        [int(t) for t in ids or []],
        lps,
        text,
        _finish(choice.get("finish_reason")),
    )


def _finish(reason: str | None) -> FinishReason:
    """OpenAI's finish reasons, as the engines name them: a cut reply is ``length``, one the server
    aborted ``abort``, any other end (a stop string, end of turn, a tool call) ``stop``."""
    if reason in ("length", "abort"):
        return reason
    return "stop"


class OpenAIEngine(RolloutEngine):
    """``RolloutEngine`` over an OpenAI-compatible server (``engine.base_url``): the core alone.

    ``model_path`` is the policy the run names; the server serves whatever it loaded, under
    ``engine.served_model`` (else its first model). ``abort`` cancels a request's HTTP call: the
    connection closes, which aborts the generation on this package's ``serve`` and on vLLM.
    """

    Params = OpenAIParams

    def __init__(self, cfg: EngineConfig, model_path: str | Path) -> None:
        self.cfg, self.model_path = cfg, str(model_path)
        self.params = p = cfg.params_for(OpenAIParams)
        api_key = None
        if p.api_key_env is not None:
            api_key = os.environ.get(p.api_key_env)
            if not api_key:
                raise EngineError(f"engine.api_key_env names {p.api_key_env}, which is not set here")
        self.client = OpenAIClient(
            p.base_url, api_key, p.request_timeout_s, p.max_connections, token_detail=True
        )
        self._model = p.served_model
        self._in_flight: dict[str, asyncio.Task[Answer]] = {}
        self._aborted: set[str] = set()
        self._closed = False
        self._started = time.monotonic()
        self._busy = BusyClock()
        self._stats = {"requests": 0, "generated_tokens": 0, "prompt_tokens": 0, "cached_tokens": 0}

    async def _served_model(self) -> str:
        if self._model is None:
            models = await self.client.models()
            if not models:
                raise EngineError(f"{self.client.base_url}/models lists no model; set engine.served_model")
            self._model = models[0]
        return self._model

    async def generate(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None = None,
    ) -> Completion:
        """One HTTP request; ``session_id`` is not sent (a server with a prefix cache, as vLLM's,
        reuses a trajectory's earlier turns without it)."""
        del session_id
        if self._closed:
            raise EngineError(f"request {request_id}: engine is shut down")
        sampling.validate()
        if request_id in self._in_flight:
            raise EngineError(f"request id {request_id!r} is already in flight")
        model = await self._served_model()
        task = asyncio.ensure_future(self.client.generate(request_id, prompt, sampling, model))
        self._in_flight[request_id] = task
        self._busy.enter()
        try:
            answer = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if request_id not in self._aborted or (current is not None and current.cancelling()):
                raise  # this call itself was cancelled, not the request aborted
            outputs = [CompletionOutput(i, [], [], "", "abort") for i in range(sampling.n)]
            return Completion(request_id, 0, 0, outputs)
        finally:
            self._busy.leave()
            del self._in_flight[request_id]
            self._aborted.discard(request_id)
        done = answer.completion
        self._stats["requests"] += 1
        self._stats["generated_tokens"] += answer.completion_tokens
        self._stats["prompt_tokens"] += done.prompt_tokens
        self._stats["cached_tokens"] += done.cached_prompt_tokens
        return done

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            task = self._in_flight.get(request_id)
            if task is not None and not task.done():
                self._aborted.add(request_id)
                task.cancel()

    async def health(self) -> dict[str, Any]:
        return {
            "backend": "openai",
            "base_url": self.params.base_url,
            "model": self._model,
            "alive": not self._closed,
            "running_requests": len(self._in_flight),
            "uptime_s": time.monotonic() - self._started,
            "busy_s": self._busy.busy_s,
            **self._stats,
        }

    async def shutdown(self) -> None:
        self._closed = True
        running = list(self._in_flight.values())
        await self.abort(list(self._in_flight))
        await asyncio.gather(*running, return_exceptions=True)
        await self.client.aclose()
