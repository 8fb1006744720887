"""A continuous-batching engine on plain transformers, for CPU machines without vLLM.

Where the time goes on CPU is the prompt, so the engine (1) keeps each trajectory's KV cache
across turns and prefills only the new suffix, (2) reuses a sibling's cached prompt, so a
group's shared first prompt is prefilled once, and (3) decodes every active sequence of every
request in one left-padded batch per step, admitting new requests between steps. The model
runs in a worker thread so the actor's event loop keeps answering ``abort`` and ``generate``
while a step is computing; aborts take effect at the next step boundary.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from selective_rollout.config.engine import EngineConfig
from selective_rollout.models import model_here
from selective_rollout.precision import engine_dtype, this_device_type
from selective_rollout.rollout.engines import grouped_attention
from selective_rollout.rollout.engines.base import (
    BackendParams,
    BusyClock,
    Completion,
    CompletionOutput,
    EngineError,
    RolloutEngine,
    SamplingParams,
    TextDelta,
)
from selective_rollout.rollout.engines.growing_cache import GrowingCache
from selective_rollout.rollout.engines.kv_store import KV, SessionKVStore, common_prefix
from selective_rollout.rollout.engines.trie import ChoiceTrie, ChoiceTries
from selective_rollout.weight_sync.receiver import WeightReceiver

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: asyncio.Future
    trie: ChoiceTrie | None
    # called from the engine's worker thread with (output index, token) as each token is sampled
    on_token: Callable[[int, int], None] | None = None
    aborted: bool = False
    cached_prompt_tokens: int = 0
    seqs: list[_Seq] = field(default_factory=list)

    def completion(self, tokenizer: Any) -> Completion:
        # an output aborted before its forced tokens were scored ends at its last scored token
        outputs = [
            CompletionOutput(
                index=s.index,
                token_ids=s.tokens[: len(s.logprobs)],
                logprobs=list(s.logprobs),
                text=tokenizer.decode(s.tokens[: len(s.logprobs)], skip_special_tokens=True),
                finish_reason=s.finish_reason or "abort",
            )
            for s in self.seqs
        ]
        return Completion(self.request_id, len(self.prompt), self.cached_prompt_tokens, outputs)


@dataclass(eq=False)
class _Seq:
    """One sampled output while it decodes.

    The KV cache holds ``tokens[:fed]``; the rest is fed by the next decode forwards. The
    log-probs of ``tokens[:fed + 1]`` are known: a token's log-prob comes from the logits at the
    position before it, so the tokens a constrained choice forced (``_force``) get theirs when the
    forward that feeds them runs."""

    req: _Request
    index: int
    generator: torch.Generator
    trie: ChoiceTrie | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    fed: int = 0

    def decided(self) -> str | None:
        """How a constrained output ends once its tokens are scored: "stop" when its choice is
        complete, "length" at ``max_tokens``, None while it goes on (an unconstrained output
        finishes as it samples, with nothing left to score)."""
        if self.trie is None:
            return None
        if self.trie.done:
            return "stop"
        return "length" if len(self.tokens) >= self.req.sampling.max_tokens else None

    def to_feed(self, limit: int) -> list[int]:
        """The next at most ``limit`` tokens for the KV cache: up to the last one, whose logits
        choose what follows; a decided output stops before its last token (nothing follows it)."""
        end = len(self.tokens) - (1 if self.decided() else 0)
        return self.tokens[self.fed : min(end, self.fed + limit)]


@dataclass(eq=False)
class _Prefill:
    """A request being admitted: its cached prefix, then its prompt KV and last-token logits."""

    req: _Request
    kv: KV | None  # the cached prefix's KV (``req.cached_prompt_tokens`` long)
    prompt_kv: KV | None = None
    logits: torch.Tensor | None = None

    @property
    def cached(self) -> int:
        return self.req.cached_prompt_tokens

    @property
    def suffix(self) -> list[int]:
        return self.req.prompt[self.cached :]


_SHARE_MIN = 16  # uncached shared prompt tokens worth waiting one prefill wave for
_PAD_SLACK = 1.25  # a prefill batch may run at most this many tokens per real suffix token
_PREFILL_TOKENS = 8192  # and at most this many (padded) tokens in one forward


def _buckets(items: list[_Prefill], size: int) -> list[list[_Prefill]]:
    """Split a wave into prefill batches of at most ``size`` requests of similar suffix length,
    so padding stays small."""
    out: list[list[_Prefill]] = []
    for it in sorted(items, key=lambda it: len(it.suffix)):
        if out:
            bucket = out[-1]
            width = len(it.suffix)  # the longest so far (sorted)
            real = sum(len(b.suffix) for b in bucket) + width
            padded = width * (len(bucket) + 1)
            if len(bucket) < size and padded <= _PAD_SLACK * real and padded <= _PREFILL_TOKENS:
                bucket.append(it)
                continue
        out.append([it])
    return out


def _left_padded_past(items: list[_Prefill], past: int) -> KV | None:
    """The items' cached KV, each left-padded with zeros to ``past`` tokens, as one batch."""
    if past == 0:
        return None
    template = next(it.kv for it in items if it.kv)
    layers = []
    for i, (k0, _) in enumerate(template):
        _, heads, _, dim = k0.shape
        zeros = k0.new_zeros(1, heads, past, dim)
        ks = [_left_pad(it.kv[i][0], past) if it.kv else zeros for it in items]
        vs = [_left_pad(it.kv[i][1], past) if it.kv else zeros for it in items]
        layers.append((torch.cat(ks), torch.cat(vs)))
    return layers


class _Batch:
    """The running decode batch: left-padded KV for every active row, and its attention mask."""

    def __init__(self) -> None:
        self.rows: list[_Seq] = []
        self.kv: KV = []
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.cache: Any = None  # the DynamicCache over ``kv``, kept across decode steps

    def set_kv(self, kv: KV) -> None:
        self.kv, self.cache = kv, None

    def add(self, groups: list[tuple[list[_Seq], KV]]) -> None:
        """Append groups of rows, each with an unpadded KV of batch ``len(seqs)``, in one copy."""
        parts = ([(self.rows, self.kv, self.mask)] if self.rows else []) + [
            (seqs, kv, torch.ones(len(seqs), kv[0][0].shape[2], dtype=torch.long)) for seqs, kv in groups
        ]
        width = max(mask.shape[1] for _, _, mask in parts)
        layers = len(parts[0][1])
        self.set_kv(
            [
                (
                    torch.cat([_left_pad(kv[i][0], width) for _, kv, _ in parts]),
                    torch.cat([_left_pad(kv[i][1], width) for _, kv, _ in parts]),
                )
                for i in range(layers)
            ]
        )
        self.mask = torch.cat([_left_pad(mask, width) for _, _, mask in parts])
        self.rows = [seq for seqs, _, _ in parts for seq in seqs]

    def keep(self, keep: list[int]) -> None:
        """Drop every row not in ``keep`` and every column no kept row attends to: the left padding,
        and the padding of decode forwards as wide as a forced run of a row now gone (positions
        come from the mask's row sums, so a column nobody attends to is safe to drop)."""
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.set_kv([])
            self.mask = torch.zeros(0, 0, dtype=torch.long)
            return
        idx = torch.tensor(keep)
        mask = self.mask.index_select(0, idx)
        used = mask.any(0).nonzero().squeeze(1)
        self.mask = mask.index_select(1, used)
        self.set_kv(
            [
                (k.index_select(0, idx).index_select(2, used), v.index_select(0, idx).index_select(2, used))
                for k, v in self.kv
            ]
        )

    def row_kv(self, row: int) -> KV:
        """The unpadded KV of one row (the store clones what it keeps): its real columns, the left
        padding and the padding of decode forwards wider than the row's own tokens left out."""
        real = self.mask[row].nonzero().squeeze(1)
        first, count = int(real[0]), len(real)
        if int(real[-1]) - first + 1 == count:  # contiguous: views
            cols = slice(first, first + count)
            return [(k[row : row + 1, :, cols], v[row : row + 1, :, cols]) for k, v in self.kv]
        return [(k[row : row + 1, :, real], v[row : row + 1, :, real]) for k, v in self.kv]


def _exponential_race(
    probs: torch.Tensor, allowed: torch.Tensor | None, vocab: int, generator: torch.Generator
) -> int:
    """Sample an index of ``probs`` as argmax(p / E) with one Exp(1) draw per *vocabulary* token
    (``probs[i]`` is token ``allowed[i]``, or token i without a constraint).

    Why not ``torch.multinomial`` over the allowed tokens: it races the same way, but its draws
    are indexed by position in the allowed list, which changes with the admissible commands. Drawn
    per token id, a sequence's k-th sampled token sees the same noise for "go" whatever the list
    holds, as vLLM's sampler does (one draw per vocabulary entry from the request's generator).
    Two evaluations of a task that share the step seeds (before and after training) then keep
    picking alike wherever the two policies nearly agree, also after their episodes part, so their
    paired difference carries less sampling noise; each draw is still an exact sample."""
    noise = torch.empty(vocab).exponential_(1.0, generator=generator)
    race = noise if allowed is None else noise.index_select(0, allowed)
    return int((probs / race).argmax())


def _scored(seq: _Seq, logprob: float) -> None:
    """Record the log-prob of ``seq``'s next unscored token and stream that token: a stream
    carries only scored tokens, so what an aborted output streamed is what its completion holds."""
    seq.logprobs.append(logprob)
    if seq.req.on_token is not None:
        seq.req.on_token(seq.index, seq.tokens[len(seq.logprobs) - 1])


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad the sequence axis (dim 2 of KV, dim 1 of a mask) on the left up to ``width``."""
    dim = 2 if t.dim() == 4 else 1
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _cache(kv: KV | None) -> Any:
    return GrowingCache(kv)


def _kv_of(cache: Any) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


class TransformersParams(BackendParams):
    threads: int = Field(0, ge=0, description="torch threads per engine; 0 = torch's default")
    max_batch_size: int = Field(64, ge=1, description="sequences decoded together")
    kv_cache_tokens: int = Field(65536, ge=0, description="session KV kept across turns (tokens)")
    prefill_batch_size: int = Field(
        16, ge=1, description="requests arriving together prefilled in one forward (1: one at a time)"
    )
    decode_chunk_tokens: int = Field(
        8,
        ge=1,
        description="tokens a sequence may feed in one decode forward: where a constrained choice "
        "leaves one legal next token, the engine takes it without a forward of its own and feeds "
        "the forced run at once (1: one token per forward)",
    )


class TransformersEngine(RolloutEngine):
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
        self._batch = _Batch()
        self._pending: deque[_Request] = deque()
        self._requests: dict[str, _Request] = {}
        self._tries = ChoiceTries(self.tokenizer, self.eot_id)
        self._seed_source = itertools.count(cfg.seed * 1_000_003)
        self._lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._closed = False
        self._stats = {
            "generated_tokens": 0,
            "forced_tokens": 0,  # of those, taken without sampling (a constrained choice's only legal token)
            "decode_forwards": 0,
            "prefilled_tokens": 0,  # prompt tokens run through the model (the uncached suffixes)
            "padded_prefill_tokens": 0,  # the same with the padding of batched prefills
            "prefill_forwards": 0,  # forwards that prefilled (one per batch of requests admitted together)
            "cached_tokens": 0,
            "requests": 0,
        }
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
        if self._closed:
            raise EngineError(f"request {request_id}: engine is shut down")
        sampling.validate()
        if request_id in self._requests:
            raise EngineError(f"request id {request_id!r} is already in flight")
        ids = self._prompt_ids(request_id, prompt)
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        if context and len(ids) + sampling.max_tokens > context:
            raise EngineError(
                f"request {request_id}: {len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed "
                f"the model's context of {context} tokens"
            )
        self._ensure_loop()
        req = _Request(
            request_id,
            ids,
            sampling,
            session_id,
            asyncio.get_running_loop().create_future(),
            self._trie(sampling.choices) if sampling.choices else None,
            on_token,
        )
        self._requests[request_id] = req
        self._pending.append(req)
        self._wake.set()
        self._busy.enter()
        try:
            return await req.future
        finally:
            self._requests.pop(request_id, None)
            self._busy.leave()

    def prompt_length(self, prompt: list[int] | list[dict]) -> int:
        """Tokens ``prompt`` takes once templated (what a server budgets a request by)."""
        return len(self._prompt_ids("prompt_length", prompt))

    async def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            req = self._requests.get(rid)
            if req is not None:
                req.aborted = True
        if self._wake is not None:
            self._wake.set()

    async def release(self, session_ids: list[str]) -> None:
        async with self._model_lock():
            self._store.drop(session_ids)

    async def reset_cache(self) -> None:
        async with self._model_lock():
            self._store.clear()

    async def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        await asyncio.to_thread(self._weights.join, host, port, rank, world_size, backend)

    async def receive_weights(self, specs: list) -> None:
        async with self._model_lock():
            try:
                await asyncio.to_thread(self._weights.receive, specs)
            finally:  # KV computed under the old weights is stale (also after a called-off sync)
                self._store.clear()

    async def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        async with self._model_lock():
            await asyncio.to_thread(self._weights.load, named_tensors)
            self._store.clear()

    async def score(self, token_ids: list[int]) -> list[float]:
        async with self._model_lock():
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
            "alive": not self._closed,
            "running_requests": len(self._requests),
            "batch_rows": len(self._batch.rows),
            "cached_sessions": len(self._store),
            "cached_kv_tokens": self._store.cached_tokens,
            "uptime_s": time.monotonic() - self._started,
            "busy_s": self._busy.busy_s,
            **self._stats,
        }

    async def shutdown(self) -> None:
        await self.abort(list(self._requests))
        self._closed = True
        if self._loop_task is not None:
            await asyncio.wait([self._loop_task], timeout=30)
        self._store.clear()

    # ----------------------------------------------------------------- scheduling
    def _model_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _ensure_loop(self) -> None:
        """Start the scheduler on the running event loop (again, if an earlier loop ended)."""
        if self._loop_task is None or self._loop_task.done():
            self._lock = asyncio.Lock()
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            if not self._pending and not self._batch.rows:
                if self._closed:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            async with self._model_lock():
                try:
                    finished = await asyncio.to_thread(self._step)
                except Exception as exc:  # a model failure must not hang every caller
                    log.exception("engine step failed")
                    finished = self._fail_all(exc)
            for req, result in finished:
                if not req.future.done():
                    if isinstance(result, BaseException):
                        req.future.set_exception(result)
                    else:
                        req.future.set_result(result)

    def _fail_all(self, exc: Exception) -> list[tuple[_Request, Any]]:
        """Every request not yet answered gets the error: the batch's, the queue's and the ones
        the failed step was admitting (in neither place at that moment)."""
        reqs = {s.req for s in self._batch.rows} | set(self._pending) | set(self._requests.values())
        self._batch = _Batch()
        self._pending.clear()
        err = EngineError(f"engine step failed: {exc!r}")
        return [(r, err) for r in reqs]

    @torch.inference_mode()
    def _step(self) -> list[tuple[_Request, Completion | Exception]]:
        """One scheduling round, in the worker thread: admit waiting requests, decode one token."""
        done: list[tuple[_Request, Completion | Exception]] = []
        for seq in self._batch.rows:
            if seq.req.aborted and seq.finish_reason is None:
                seq.finish_reason = "abort"
        done += self._retire()
        incoming: list[_Request] = []
        rows = len(self._batch.rows)
        while self._pending and rows < self.params.max_batch_size:
            incoming.append(self._pending.popleft())
            rows += incoming[-1].sampling.n
        admitted, answered = self._admit_all(incoming) if incoming else ([], [])
        done += answered
        if admitted:
            self._batch.add(admitted)
        if self._batch.rows:
            self._decode()
            done += self._retire()
        return done

    def _admit_all(
        self, reqs: list[_Request]
    ) -> tuple[list[tuple[list[_Seq], KV]], list[tuple[_Request, Any]]]:
        """Prefill the requests that arrived together and sample each output's first token.

        Returns the rows still to decode with their KV, and the requests already answered
        (aborted, finished at their first token, or failed on their own). Requests are prefilled
        in waves: one whose prompt shares more than ``_SHARE_MIN`` uncached tokens with a request
        of the current wave (a group's siblings on their first turn) waits for the next wave,
        where it finds that prompt in the session store instead of prefilling it again.
        """
        rows: list[tuple[list[_Seq], KV]] = []
        done: list[tuple[_Request, Any]] = []
        waiting = reqs
        while waiting:
            wave, deferred = [], []
            for req in waiting:
                if not self._shares_with(req, wave):
                    item = self._prepare(req)
                    if item is None:
                        done.append((req, req.completion(self.tokenizer)))
                    else:
                        wave.append(item)
                else:
                    deferred.append(req)
            for bucket in _buckets(wave, self.params.prefill_batch_size):
                self._prefill_isolated(bucket, done)
            for item in wave:
                if item.logits is None:  # its prefill failed (answered in ``done``)
                    continue
                try:
                    group = self._finish(item)
                except Exception as exc:  # this request's own failure: its batch neighbours go on
                    log.exception("request %s failed at admission", item.req.request_id)
                    done.append((item.req, EngineError(f"request {item.req.request_id} failed: {exc!r}")))
                    continue
                if group is None:
                    done.append((item.req, item.req.completion(self.tokenizer)))
                else:
                    rows.append(group)
            waiting = deferred
        return rows, done

    def _shares_with(self, req: _Request, wave: list[_Prefill]) -> bool:
        """Whether ``req``'s prompt shares more than ``_SHARE_MIN`` tokens beyond what the store
        holds for it with a request of ``wave`` that will store its prompt (has a session), so
        waiting one wave saves prefilling them twice."""
        if req.session_id is None or not wave:
            return False
        cached, _ = self._store.lookup(req.session_id, req.prompt, peek=True)
        prompt = torch.as_tensor(req.prompt)
        return any(
            item.req.session_id is not None
            and common_prefix(prompt, torch.as_tensor(item.req.prompt)) - cached > _SHARE_MIN
            for item in wave
        )

    def _prepare(self, req: _Request) -> _Prefill | None:
        """The request's outputs and its cached prefix; None when it was aborted while queued."""
        sp = req.sampling
        req.seqs = [
            _Seq(req, i, self._generator(sp.seed, i), req.trie.fork() if req.trie else None)
            for i in range(sp.n)
        ]
        if req.aborted:
            for s in req.seqs:
                s.finish_reason = "abort"
            return None
        cached, kv = self._store.lookup(req.session_id, req.prompt)
        req.cached_prompt_tokens = cached
        return _Prefill(req, kv)

    def _prefill_isolated(self, bucket: list[_Prefill], done: list[tuple[_Request, Any]]) -> None:
        """Prefill ``bucket`` in one forward; if that fails, one at a time, so a request that
        breaks the forward fails alone."""
        try:
            self._prefill(bucket)
            return
        except Exception:
            if len(bucket) == 1:
                log.exception("request %s failed at prefill", bucket[0].req.request_id)
                req = bucket[0].req
                done.append((req, EngineError(f"request {req.request_id} failed at prefill")))
                return
            log.exception("a batched prefill of %d requests failed; prefilling them one by one", len(bucket))
        for item in bucket:
            self._prefill_isolated([item], done)

    def _prefill(self, items: list[_Prefill]) -> None:
        """One forward over the uncached suffixes of ``items``; fills each item's prompt KV and
        last-token logits. Rows are laid out ``[zeros][cached prefix][suffix][right padding]``:
        the zeros stand in for a shorter cached prefix (masked), and padding after the suffix
        (masked, and never read by the real tokens before it) keeps every query row attending to
        at least one real key, so no padded position computes NaNs that could leak."""
        past = max(it.cached for it in items)
        width = max(len(it.suffix) for it in items)
        n = len(items)
        ids = torch.zeros(n, width, dtype=torch.long)
        positions = torch.zeros(n, width, dtype=torch.long)
        mask = torch.zeros(n, past + width, dtype=torch.long)
        for r, it in enumerate(items):
            suffix = it.suffix
            ids[r, : len(suffix)] = torch.tensor(suffix)
            positions[r] = torch.arange(it.cached, it.cached + width)
            mask[r, past - it.cached : past + len(suffix)] = 1
        last = sorted({len(it.suffix) - 1 for it in items})
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask if n > 1 else None,
            past_key_values=_cache(_left_padded_past(items, past)),
            use_cache=True,
            logits_to_keep=torch.tensor(last),
        )
        kv = _kv_of(out.past_key_values)
        for r, it in enumerate(items):
            keep = slice(past - it.cached, past + len(it.suffix))
            it.prompt_kv = [(k[r : r + 1, :, keep], v[r : r + 1, :, keep]) for k, v in kv]
            it.logits = out.logits[r, last.index(len(it.suffix) - 1)].float()
        self._stats["prefill_forwards"] += 1
        self._stats["prefilled_tokens"] += sum(len(it.suffix) for it in items)
        self._stats["padded_prefill_tokens"] += n * width

    def _finish(self, item: _Prefill) -> tuple[list[_Seq], KV] | None:
        """Keep the new prompt KV for the session and sample each output's first token; returns
        the rows still to decode with their KV, or None when the request is already done."""
        req, prompt_kv = item.req, item.prompt_kv
        self._stats["cached_tokens"] += item.cached
        self._stats["requests"] += 1
        if req.session_id is not None and item.cached < len(req.prompt) - 1:
            # Worth keeping only if it is new: a sibling that reused a whole cached prompt
            # would store a duplicate (its own KV is stored when it finishes).
            self._store.put(req.session_id, req.prompt, prompt_kv)
        for s in req.seqs:
            self._sample(s, item.logits)
        live = [s for s in req.seqs if s.finish_reason is None]
        if not live:
            return None
        n = len(live)
        return live, [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in prompt_kv]

    def _decode(self) -> None:
        """One forward over every row's next tokens (one, or a run a constrained choice forced),
        right-padded to the widest: log-probs for the forced tokens, a sampled token after the
        last one. The padding columns stay in the KV, masked (``_Batch.row_kv`` skips them)."""
        batch = self._batch
        rows = len(batch.rows)
        chunks = [s.to_feed(self.params.decode_chunk_tokens) for s in batch.rows]
        width = max(len(c) for c in chunks)
        inputs = torch.zeros(rows, width, dtype=torch.long)
        fresh = torch.zeros(rows, width, dtype=torch.long)
        for r, chunk in enumerate(chunks):
            inputs[r, : len(chunk)] = torch.tensor(chunk)
            fresh[r, : len(chunk)] = 1
        positions = batch.mask.sum(1, keepdim=True) + torch.arange(width)
        mask = torch.cat([batch.mask, fresh], dim=1)
        out = self.model(
            input_ids=inputs,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=batch.cache if batch.cache is not None else _cache(batch.kv),
            use_cache=True,
        )
        batch.cache, batch.kv, batch.mask = out.past_key_values, _kv_of(out.past_key_values), mask
        self._stats["decode_forwards"] += 1
        logits = out.logits.float()
        for r, (s, chunk) in enumerate(zip(batch.rows, chunks, strict=True)):
            s.fed += len(chunk)
            for j in range(len(chunk) - 1 if s.fed == len(s.tokens) else len(chunk)):
                # position j predicts token fed - len(chunk) + j + 1: a forced one
                token = s.tokens[s.fed - len(chunk) + j + 1]
                _scored(s, float(logits[r, j, token] - logits[r, j].logsumexp(-1)))
            if s.fed == len(s.tokens):
                self._sample(s, logits[r, len(chunk) - 1])
            elif s.fed == len(s.tokens) - 1:  # every token scored: a decided output ends here
                s.finish_reason = s.decided()

    def _sample(self, seq: _Seq, logits: torch.Tensor) -> None:
        """Sample one token for ``seq``; record the model's own (untempered) log-prob of it."""
        sp = seq.req.sampling
        logprobs = F.log_softmax(logits, dim=-1)
        allowed = torch.tensor(seq.trie.allowed()) if seq.trie is not None else None
        scores = logits if allowed is None else logits.index_select(0, allowed)
        if sp.temperature == 0:
            pick = int(scores.argmax())
        else:
            probs = F.softmax(scores / sp.temperature, dim=-1)
            if sp.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                keep = sorted_p.cumsum(0) - sorted_p < sp.top_p  # always keeps the top token
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
            pick = _exponential_race(probs, allowed, logits.numel(), seq.generator)
        token = pick if allowed is None else int(allowed[pick])
        self._emit(seq, token)
        _scored(seq, float(logprobs[token]))
        if seq.trie is None:
            if token == self.eot_id or (sp.stop_token_ids and token in sp.stop_token_ids):
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= sp.max_tokens:
                seq.finish_reason = "length"
            return
        self._force(seq)
        if len(seq.logprobs) == len(seq.tokens):  # else the forward that scores the forced run ends it
            seq.finish_reason = seq.decided()

    def _force(self, seq: _Seq) -> None:
        """Take the tokens a constrained choice leaves no alternative to (jump-forward decoding:
        in ALFWorld commands about three tokens in four are forced, ``go`` -> `` to``). Sampling
        from one legal token always picks it, so the outputs are those of token-by-token decoding;
        only their log-probs come later, from the forward that feeds them."""
        limit = seq.req.sampling.max_tokens
        while not seq.trie.done and len(seq.tokens) < limit:
            allowed = seq.trie.allowed()
            if len(allowed) != 1:
                return
            self._emit(seq, allowed[0])
            self._stats["forced_tokens"] += 1

    def _emit(self, seq: _Seq, token: int) -> None:
        seq.tokens.append(token)
        self._stats["generated_tokens"] += 1
        if seq.trie is not None:
            seq.trie.advance(token)

    def _retire(self) -> list[tuple[_Request, Completion]]:
        """Remove finished rows from the batch; return requests whose every output finished."""
        batch = self._batch
        keep = []
        finished_reqs: dict[_Request, None] = {}
        for i, s in enumerate(batch.rows):
            if s.finish_reason is None:
                keep.append(i)
                continue
            req = s.req
            if req.session_id is not None and req.sampling.n == 1 and s.finish_reason != "abort":
                # The KV holds prompt + all generated tokens but the last (never fed back).
                self._store.put(req.session_id, req.prompt + s.tokens[: s.fed], batch.row_kv(i))
            finished_reqs[req] = None
        batch.keep(keep)
        return [
            (req, req.completion(self.tokenizer))
            for req in finished_reqs
            if all(s.finish_reason is not None for s in req.seqs)
        ]

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

    def _trie(self, choices: list[str]) -> ChoiceTrie:
        return self._tries(choices).fork()

    def _generator(self, seed: int | None, index: int) -> torch.Generator:
        gen = torch.Generator()
        gen.manual_seed(seed + index if seed is not None else next(self._seed_source))
        return gen
