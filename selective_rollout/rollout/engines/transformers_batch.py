"""The transformers engine's padded batches and the forwards that run them.

Prefill: the requests admitted together are bucketed by suffix length and each bucket runs one
forward over ``[zeros][cached prefix][suffix][right padding]`` rows. Decode: every active output
is a row of one left-padded KV batch (``DecodeBatch``), to which admitted rows are stitched and
from which finished rows and the columns nobody attends to any more are cut. What is sampled from
the logits is the sampler's business; this module only lays out tokens, masks and KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from selective_rollout.rollout.engines.growing_cache import GrowingCache
from selective_rollout.rollout.engines.kv_store import KV
from selective_rollout.rollout.engines.transformers_request import Request, Seq

_PAD_SLACK = 1.25  # a prefill batch may run at most this many tokens per real suffix token
_PREFILL_TOKENS = 8192  # and at most this many (padded) tokens in one forward


@dataclass(eq=False)
class Prefill:
    """A request being admitted: its cached prefix, then its prompt KV and last-token logits."""

    req: Request
    kv: KV | None  # the cached prefix's KV (``req.cached_prompt_tokens`` long)
    prompt_kv: KV | None = None
    logits: torch.Tensor | None = None

    @property
    def cached(self) -> int:
        return self.req.cached_prompt_tokens

    @property
    def suffix(self) -> list[int]:
        return self.req.prompt[self.cached :]


def buckets(items: list[Prefill], size: int) -> list[list[Prefill]]:
    """Split a wave into prefill batches of at most ``size`` requests of similar suffix length,
    so padding stays small."""
    out: list[list[Prefill]] = []
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


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad the sequence axis (dim 2 of KV, dim 1 of a mask) on the left up to ``width``."""
    dim = 2 if t.dim() == 4 else 1
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _left_padded_past(items: list[Prefill], past: int) -> KV | None:
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


def _kv_of(cache: Any) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


class DecodeBatch:
    """The running decode batch: left-padded KV for every active row, and its attention mask."""

    def __init__(self) -> None:
        self.rows: list[Seq] = []
        self.kv: KV = []
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.cache: Any = None  # the DynamicCache over ``kv``, kept across decode steps

    def set_kv(self, kv: KV) -> None:
        self.kv, self.cache = kv, None

    def add(self, groups: list[tuple[list[Seq], KV]]) -> None:
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


class BatchRunner:
    """Runs the model over padded prefill and decode batches and counts those forwards (the
    counts are the engine's ``health()`` keys of the same names)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.stats = {
            "decode_forwards": 0,
            "prefilled_tokens": 0,  # prompt tokens run through the model (the uncached suffixes)
            "padded_prefill_tokens": 0,  # the same with the padding of batched prefills
            "prefill_forwards": 0,  # forwards that prefilled (one per batch of requests admitted together)
        }

    def prefill(self, items: list[Prefill]) -> None:
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
            past_key_values=GrowingCache(_left_padded_past(items, past)),
            use_cache=True,
            logits_to_keep=torch.tensor(last),
        )
        kv = _kv_of(out.past_key_values)
        for r, it in enumerate(items):
            keep = slice(past - it.cached, past + len(it.suffix))
            it.prompt_kv = [(k[r : r + 1, :, keep], v[r : r + 1, :, keep]) for k, v in kv]
            it.logits = out.logits[r, last.index(len(it.suffix) - 1)].float()
        self.stats["prefill_forwards"] += 1
        self.stats["prefilled_tokens"] += sum(len(it.suffix) for it in items)
        self.stats["padded_prefill_tokens"] += n * width

    def decode(self, batch: DecodeBatch, limit: int) -> list[torch.Tensor]:
        """One forward over every row's next tokens (one, or a run a constrained choice forced,
        at most ``limit``), right-padded to the widest; advances each row's ``fed`` and returns
        each row's float logits at the positions it was fed. The padding columns stay in the KV,
        masked (``DecodeBatch.row_kv`` skips them)."""
        rows = len(batch.rows)
        chunks = [s.to_feed(limit) for s in batch.rows]
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
            past_key_values=batch.cache if batch.cache is not None else GrowingCache(batch.kv),
            use_cache=True,
        )
        batch.cache, batch.kv, batch.mask = out.past_key_values, _kv_of(out.past_key_values), mask
        self.stats["decode_forwards"] += 1
        logits = out.logits.float()
        for seq, chunk in zip(batch.rows, chunks, strict=True):
            seq.fed += len(chunk)
        return [logits[r, : len(chunk)] for r, chunk in enumerate(chunks)]
