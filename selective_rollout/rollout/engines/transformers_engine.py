"""A continuous-batching engine on plain transformers, for CPU machines without vLLM.

Where the time goes on CPU is the prompt, so the engine (1) keeps each trajectory's KV cache
across turns and prefills only the new suffix, (2) reuses a sibling's cached prompt, so a
group's shared first prompt is prefilled once, and (3) decodes every active sequence of every
request in one left-padded batch per step, admitting new requests between steps. The model
runs in a worker thread so the actor's event loop keeps answering ``abort`` and ``generate``
while a step is computing; aborts take effect at the next step boundary.

This module is the ``RolloutEngine`` face (requests in, completions and streams out, weights,
scoring, health); the work is composed from ``transformers_scheduler`` (queue, admission waves,
decode steps, aborts), ``transformers_batch`` (padded prefill and decode batches and their
forwards) and ``transformers_sampler`` (sampling, constrained choice, jump-forward, log-probs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import torch

from selective_rollout.config.engine import EngineConfig
from selective_rollout.models import model_here
from selective_rollout.precision import engine_dtype, this_device_type
from selective_rollout.rollout.engines import grouped_attention
from selective_rollout.rollout.engines.base import (
    BusyClock,
    CacheControl,
    Completion,
    EngineError,
    LogprobProbe,
    RolloutEngine,
    SamplingParams,
    TextDelta,
    WeightSync,
)
from selective_rollout.rollout.engines.kv_store import SessionKVStore
from selective_rollout.rollout.engines.params import TransformersParams
from selective_rollout.rollout.engines.transformers_batch import BatchRunner
from selective_rollout.rollout.engines.transformers_request import Request
from selective_rollout.rollout.engines.transformers_sampler import Sampler
from selective_rollout.rollout.engines.transformers_scheduler import Scheduler
from selective_rollout.weight_sync.receiver import WeightReceiver

log = logging.getLogger(__name__)


class TransformersEngine(RolloutEngine, WeightSync, LogprobProbe, CacheControl):
    """Continuous batching on ``AutoModelForCausalLM`` with session KV reuse (the CPU default);
    usable directly or as a Ray actor."""

    Params = TransformersParams

    def __init__(self, cfg: EngineConfig, model_path: str | Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.params = cfg.params_for(TransformersParams)
        if self.params.threads > 0:
            torch.set_num_threads(self.params.threads)
        self.cfg = cfg
        self.model_path = str(model_here(str(model_path)))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        resolved = engine_dtype(cfg.dtype, this_device_type())
        if resolved != cfg.dtype:
            log.info("engine.dtype %s: %s on this %s", cfg.dtype, resolved, this_device_type())
        dtype = getattr(torch, resolved) if resolved != "auto" else "auto"
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=dtype, attn_implementation=grouped_attention.register()
        ).eval()
        self.eot_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token)
        self._weights = WeightReceiver(self.model)
        self._store = SessionKVStore(self.params.kv_cache_tokens)
        self._sampler = Sampler(self.tokenizer, self.eot_id, cfg.seed)
        self._runner = BatchRunner(self.model)
        self._scheduler = Scheduler(self.params, self._runner, self._sampler, self._store, self.tokenizer)
        self._started = time.monotonic()
        self._busy = BusyClock()

    # ----------------------------------------------------------------- public interface
    async def generate(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None = None,
    ) -> Completion:
        return await self._generate(request_id, prompt, sampling, session_id)

    async def stream(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None = None,
    ) -> AsyncIterator[TextDelta | Completion]:
        """``generate``, streamed: a ``TextDelta`` for each output as new text decodes (each
        output's last delta carries its finish reason), then the request's ``Completion`` (usage,
        token ids, log-probs). Closing the iterator early aborts the request, which is how a
        server frees the engine when its client goes away. The deltas of an output add up to its
        final text exactly; text ending in an incomplete UTF-8 character is held back until the
        character is whole."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[tuple[int, int]] = asyncio.Queue()

        def on_token(index: int, token: int) -> None:  # the worker thread
            loop.call_soon_threadsafe(tokens.put_nowait, (index, token))

        task = asyncio.ensure_future(self._generate(request_id, prompt, sampling, session_id, on_token))
        decoded: dict[int, list[int]] = defaultdict(list)
        sent: dict[int, str] = defaultdict(str)
        try:
            # every token is queued before the step that sampled it returns, so once the request
            # is done the queue holds all of its tokens
            while not (task.done() and tokens.empty()):
                getter = asyncio.ensure_future(tokens.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                index, token = getter.result()
                decoded[index].append(token)
                text = self.tokenizer.decode(decoded[index], skip_special_tokens=True)
                if len(text) > len(sent[index]) and not text.endswith("\ufffd"):
                    yield TextDelta(index, text[len(sent[index]) :])
                    sent[index] = text
            completion = task.result()
            for out in completion.outputs:
                yield TextDelta(out.index, out.text[len(sent[out.index]) :], out.finish_reason)
            yield completion
        finally:
            if not task.done():  # the consumer stopped early (a client that went away)
                await self.abort([request_id])
                await asyncio.wait([task])

    async def _generate(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> Completion:
        if self._scheduler.closed:
            raise EngineError(f"request {request_id}: engine is shut down")
        sampling.validate()
        if request_id in self._scheduler.requests:
            raise EngineError(f"request id {request_id!r} is already in flight")
        ids = self._prompt_ids(request_id, prompt)
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        if context and len(ids) + sampling.max_tokens > context:
            raise EngineError(
                f"request {request_id}: {len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed "
                f"the model's context of {context} tokens"
            )
        req = Request(
            request_id,
            ids,
            sampling,
            session_id,
            asyncio.get_running_loop().create_future(),
            self._sampler.trie(sampling.choices) if sampling.choices else None,
            on_token,
        )
        self._busy.enter()
        try:
            return await self._scheduler.submit(req)
        finally:
            self._busy.leave()

    def prompt_length(self, prompt: list[int] | list[dict]) -> int:
        """Tokens ``prompt`` takes once templated (what a server budgets a request by)."""
        return len(self._prompt_ids("prompt_length", prompt))

    async def abort(self, request_ids: list[str]) -> None:
        self._scheduler.abort(request_ids)

    async def release(self, session_ids: list[str]) -> None:
        async with self._scheduler.model_lock():
            self._store.drop(session_ids)

    async def reset_cache(self) -> None:
        async with self._scheduler.model_lock():
            self._store.clear()

    async def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        await asyncio.to_thread(self._weights.join, host, port, rank, world_size, backend)

    async def receive_weights(self, specs: list, version: int) -> None:
        """Between two decode steps (the model lock): replies in flight go on, their next tokens
        chosen by the new weights over the KV the old ones computed for their prompt and earlier
        tokens. Such a token's distribution depends on both, so it keeps the version of the
        weights at its reply's admission (``CompletionOutput.versions``: the oldest weights a
        token depends on), and its log-prob is exactly that of the distribution that sampled it.
        The sessions' cached KV, which later turns would reuse as their prompt, is dropped."""
        async with self._scheduler.model_lock():
            try:
                await asyncio.to_thread(self._weights.receive, specs)
                self._sampler.version = version
            finally:  # KV computed under the old weights is stale (also after a called-off sync)
                self._store.clear()

    async def load_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        async with self._scheduler.model_lock():
            await asyncio.to_thread(self._weights.load, named_tensors)
            self._sampler.version = version
            self._store.clear()

    async def score(self, token_ids: list[int]) -> list[float]:
        async with self._scheduler.model_lock():
            return await asyncio.to_thread(self._score, token_ids)

    @torch.no_grad()
    def _score(self, token_ids: list[int]) -> list[float]:
        ids = torch.tensor([token_ids], device=self.model.device)
        logits = self.model(input_ids=ids).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0].tolist()

    async def weights_checksum(self) -> float:
        return self._weights.checksum()

    async def health(self) -> dict[str, Any]:
        return {
            "backend": "transformers",
            "model": self.model_path,
            "alive": not self._scheduler.closed,
            "running_requests": len(self._scheduler.requests),
            # tokens the replies still in flight have scored so far
            "in_flight_tokens": sum(
                len(s.logprobs) for r in list(self._scheduler.requests.values()) for s in r.seqs
            ),
            "batch_rows": len(self._scheduler.batch.rows),
            "cached_sessions": len(self._store),
            "cached_kv_tokens": self._store.cached_tokens,
            "weights_version": self._sampler.version,
            "uptime_s": time.monotonic() - self._started,
            "busy_s": self._busy.busy_s,
            **self._sampler.stats,
            **self._runner.stats,
            **self._scheduler.stats,
        }

    async def shutdown(self) -> None:
        await self._scheduler.close()
        self._store.clear()

    # ----------------------------------------------------------------- helpers
    def _prompt_ids(self, request_id: str, prompt: list[int] | list[dict]) -> list[int]:
        if not prompt:
            raise EngineError(f"request {request_id}: empty prompt")
        if isinstance(prompt[0], dict):
            enc = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)
        else:
            ids = [int(t) for t in prompt]
        vocab = self.model.config.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise EngineError(f"request {request_id}: prompt has token ids outside [0, {vocab})")
        return ids
