"""A KV cache whose layers grow in place, for the transformers engine's decode batch.

transformers' ``DynamicLayer`` appends each decoded token with ``torch.cat``, which copies the
whole batch's keys and values, per layer, per token: in a profile of the CPU profile's rollouts
that copy was about a sixth of the engine's step time. These layers keep spare capacity
(amortised doubling), write the new token in place, and hand attention views of the filled part.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` with a buffer of spare capacity; ``keys``/``values`` are views of it."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._filled = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._filled, self._filled + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            capacity = max(2 * end, end + 64)
            self._k, self._v = (
                self._grow(self._k, key_states, capacity),
                self._grow(self._v, value_states, capacity),
            )
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self._filled = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def _grow(self, old: torch.Tensor | None, new: torch.Tensor, capacity: int) -> torch.Tensor:
        b, h, _, d = new.shape
        buf = new.new_empty(b, h, capacity, d)
        if old is not None:
            buf[:, :, : self._filled] = old[:, :, : self._filled]
        return buf


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of ``GrowingLayer``s, optionally filled with ``kv`` (one (K, V) per layer)."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        if not kv:
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
            return
        layers = [GrowingLayer() for _ in kv]
        for layer, (k, v) in zip(layers, kv, strict=True):
            layer.update(k, v)
        Cache.__init__(self, layers=layers)
