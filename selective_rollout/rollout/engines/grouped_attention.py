"""Grouped-query attention without copying the KV cache, for the transformers engine on CPU.

Models with fewer KV heads than query heads (SmolLM2-135M: 9 query, 3 KV heads; Qwen2.5) hit
transformers' SDPA path with a padding mask on CPU, which repeats every cached key and value
once per query head of the group before each attention call: a full copy of the batch's KV,
per layer, per decoded token (about a fifth of the engine's step time in a profile of the CPU
profile's rollouts). Folding the query heads of a group into the query-length axis instead
(``[B, H, Lq, D] -> [B, H_kv, rep * Lq, D]``, the mask repeated ``rep`` times along it) lets one
SDPA call read each cached KV head once; the result is the same attention, reshaped back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "grouped_sdpa"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rep = getattr(module, "num_key_value_groups", 1)
    if rep == 1 or attention_mask is None:  # nothing to repeat, or SDPA's own GQA applies
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    b, heads, lq, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    # query head j reads KV head j // rep (as repeat_kv lays them out)
    q = query.reshape(b, kv_heads, rep * lq, d)
    mask = attention_mask[:, :, None].expand(b, attention_mask.shape[1], rep, lq, kv_len)
    mask = mask.reshape(b, attention_mask.shape[1], rep * lq, kv_len)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(b, heads, lq, d).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function with transformers (idempotent); returns its ``attn_implementation`` name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the same padding + causal masks as "sdpa"
    return NAME
