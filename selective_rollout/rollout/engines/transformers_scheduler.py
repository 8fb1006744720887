"""The transformers engine's scheduler: the queue, admission in prefill waves, the decode steps
and aborts.

Requests wait in a queue until the next step boundary; each step, run in a worker thread so the
event loop keeps answering ``abort`` and ``generate``, retires what finished or was aborted,
admits what fits the batch (prefilled in waves, so a group's siblings share one prefill) and
decodes one step of every row. Aborts take effect at the next step boundary.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import torch

from selective_rollout.rollout.engines.base import Completion, EngineError
from selective_rollout.rollout.engines.kv_store import KV, SessionKVStore, common_prefix
from selective_rollout.rollout.engines.params import TransformersParams
from selective_rollout.rollout.engines.transformers_batch import BatchRunner, DecodeBatch, Prefill, buckets
from selective_rollout.rollout.engines.transformers_request import Request, Seq
from selective_rollout.rollout.engines.transformers_sampler import Sampler

log = logging.getLogger(__name__)

_SHARE_MIN = 16  # uncached shared prompt tokens worth waiting one prefill wave for


class Scheduler:
    """Continuous batching over ``runner``: owns the queue, the requests in flight and the decode
    batch, and answers each request's future once all its outputs have finished."""

    def __init__(
        self,
        params: TransformersParams,
        runner: BatchRunner,
        sampler: Sampler,
        store: SessionKVStore,
        tokenizer: Any,
    ) -> None:
        self._params = params
        self._runner = runner
        self._sampler = sampler
        self._store = store
        self._tokenizer = tokenizer
        self.batch = DecodeBatch()
        self.requests: dict[str, Request] = {}
        self.closed = False
        self.stats = {"cached_tokens": 0, "requests": 0}
        self._pending: deque[Request] = deque()
        self._lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None

    async def submit(self, req: Request) -> Completion:
        """Queue ``req`` for the next step and wait for its completion."""
        self._ensure_loop()
        self.requests[req.request_id] = req
        self._pending.append(req)
        self._wake.set()
        try:
            return await req.future
        finally:
            self.requests.pop(req.request_id, None)

    def abort(self, request_ids: list[str]) -> None:
        """Mark the requests aborted (unknown ids are ignored); the next step answers them."""
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                req.aborted = True
        if self._wake is not None:
            self._wake.set()

    async def close(self) -> None:
        """Abort every request in flight and wait (at most 30 s) for the loop to answer them."""
        self.abort(list(self.requests))
        self.closed = True
        if self._loop_task is not None:
            await asyncio.wait([self._loop_task], timeout=30)

    def model_lock(self) -> asyncio.Lock:
        """Held by each step and by whatever else uses the model or the KV store (weight loads,
        scoring, cache drops), so none of them runs in the middle of a step."""
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
            if not self._pending and not self.batch.rows:
                if self.closed:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            async with self.model_lock():
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

    def _fail_all(self, exc: Exception) -> list[tuple[Request, Any]]:
        """Every request not yet answered gets the error: the batch's, the queue's and the ones
        the failed step was admitting (in neither place at that moment)."""
        reqs = {s.req for s in self.batch.rows} | set(self._pending) | set(self.requests.values())
        self.batch = DecodeBatch()
        self._pending.clear()
        err = EngineError(f"engine step failed: {exc!r}")
        return [(r, err) for r in reqs]

    @torch.inference_mode()
    def _step(self) -> list[tuple[Request, Completion | Exception]]:
        """One scheduling round, in the worker thread: admit waiting requests, decode one token."""
        done: list[tuple[Request, Completion | Exception]] = []
        for seq in self.batch.rows:
            if seq.req.aborted and seq.finish_reason is None:
                seq.finish_reason = "abort"
        done += self._retire()
        incoming: list[Request] = []
        rows = len(self.batch.rows)
        while self._pending and rows < self._params.max_batch_size:
            incoming.append(self._pending.popleft())
            rows += incoming[-1].sampling.n
        admitted, answered = self._admit_all(incoming) if incoming else ([], [])
        done += answered
        if admitted:
            self.batch.add(admitted)
        if self.batch.rows:
            logits = self._runner.decode(self.batch, self._params.decode_chunk_tokens)
            for seq, row_logits in zip(self.batch.rows, logits, strict=True):
                self._sampler.advance(seq, row_logits)
            done += self._retire()
        return done

    def _admit_all(self, reqs: list[Request]) -> tuple[list[tuple[list[Seq], KV]], list[tuple[Request, Any]]]:
        """Prefill the requests that arrived together and sample each output's first token.

        Returns the rows still to decode with their KV, and the requests already answered
        (aborted, finished at their first token, or failed on their own). Requests are prefilled
        in waves: one whose prompt shares more than ``_SHARE_MIN`` uncached tokens with a request
        of the current wave (a group's siblings on their first turn) waits for the next wave,
        where it finds that prompt in the session store instead of prefilling it again.
        """
        rows: list[tuple[list[Seq], KV]] = []
        done: list[tuple[Request, Any]] = []
        waiting = reqs
        while waiting:
            wave, deferred = [], []
            for req in waiting:
                if not self._shares_with(req, wave):
                    item = self._prepare(req)
                    if item is None:
                        done.append((req, req.completion(self._tokenizer)))
                    else:
                        wave.append(item)
                else:
                    deferred.append(req)
            for bucket in buckets(wave, self._params.prefill_batch_size):
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
                    done.append((item.req, item.req.completion(self._tokenizer)))
                else:
                    rows.append(group)
            waiting = deferred
        return rows, done

    def _shares_with(self, req: Request, wave: list[Prefill]) -> bool:
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

    def _prepare(self, req: Request) -> Prefill | None:
        """The request's outputs and its cached prefix; None when it was aborted while queued."""
        req.seqs = self._sampler.outputs(req)
        if req.aborted:
            for s in req.seqs:
                s.finish_reason = "abort"
            return None
        cached, kv = self._store.lookup(req.session_id, req.prompt)
        req.cached_prompt_tokens = cached
        return Prefill(req, kv)

    def _prefill_isolated(self, bucket: list[Prefill], done: list[tuple[Request, Any]]) -> None:
        """Prefill ``bucket`` in one forward; if that fails, one at a time, so a request that
        breaks the forward fails alone."""
        try:
            self._runner.prefill(bucket)
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

    def _finish(self, item: Prefill) -> tuple[list[Seq], KV] | None:
        """Keep the new prompt KV for the session and sample each output's first token; returns
        the rows still to decode with their KV, or None when the request is already done."""
        req, prompt_kv = item.req, item.prompt_kv
        self.stats["cached_tokens"] += item.cached
        self.stats["requests"] += 1
        if req.session_id is not None and item.cached < len(req.prompt) - 1:
            # Worth keeping only if it is new: a sibling that reused a whole cached prompt
            # would store a duplicate (its own KV is stored when it finishes).
            self._store.put(req.session_id, req.prompt, prompt_kv)
        for s in req.seqs:
            self._sampler.sample(s, item.logits)
        live = [s for s in req.seqs if s.finish_reason is None]
        if not live:
            return None
        n = len(live)
        return live, [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in prompt_kv]

    def _retire(self) -> list[tuple[Request, Completion]]:
        """Remove finished rows from the batch; return requests whose every output finished."""
        batch = self.batch
        keep = []
        finished_reqs: dict[Request, None] = {}
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
            (req, req.completion(self._tokenizer))
            for req in finished_reqs
            if all(s.finish_reason is not None for s in req.seqs)
        ]
