"""Per-trajectory KV caches kept between turns, with a token budget and LRU eviction.

On CPU the prompt is the cost (a 355-token prefill of SmolLM2 takes ~1 s on 2 cores), and a
trajectory's next prompt extends its previous one, so the engine keeps each trajectory's KV
and prefills only the new observation. A lookup also considers the other cached trajectories:
the G trajectories of a group share their first prompt, so the group's prompt is prefilled
once and reused by all of them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, heads, length, dim]


@dataclass
class _Entry:
    tokens: torch.Tensor  # [length] ids whose keys/values the cache holds
    kv: KV


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if len(diff) else n


class SessionKVStore:
    """session id -> (token ids, KV); total cached tokens stay under ``budget_tokens``."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    def put(self, session_id: str, tokens: list[int] | torch.Tensor, kv: KV) -> None:
        """Store a trajectory's KV (cloned, so the batch tensors it came from can be freed)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        length = len(tokens)
        if length == 0 or length > self.budget_tokens:
            self.drop([session_id])
            return
        kv = [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in kv]
        self.drop([session_id])
        self._entries[session_id] = _Entry(tokens, kv)
        self._tokens += length
        while self._tokens > self.budget_tokens:
            self.drop([next(iter(self._entries))])

    def lookup(self, session_id: str | None, prompt: list[int], peek: bool = False) -> tuple[int, KV | None]:
        """Longest cached prefix of ``prompt``: its length and the KV views covering it.

        At least one prompt token is always left to prefill, because its logits are needed.
        ``peek`` asks without counting it as a use (the LRU order stays).
        """
        if not self._entries or len(prompt) < 2:
            return 0, None
        query = torch.as_tensor(prompt, dtype=torch.long)
        best_len, best_id = 0, None
        if session_id is not None and session_id in self._entries:
            best_len = common_prefix(self._entries[session_id].tokens, query)
            best_id = session_id
        for sid, entry in self._entries.items():
            if sid != best_id:
                n = common_prefix(entry.tokens, query)
                if n > best_len:
                    best_len, best_id = n, sid
        best_len = min(best_len, len(prompt) - 1)
        if best_id is None or best_len == 0:
            return 0, None
        if not peek:
            self._entries.move_to_end(best_id)
        kv = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in self._entries[best_id].kv]
        return best_len, kv

    def drop(self, session_ids: list[str]) -> None:
        for sid in session_ids:
            entry = self._entries.pop(sid, None)
            if entry is not None:
                self._tokens -= len(entry.tokens)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
