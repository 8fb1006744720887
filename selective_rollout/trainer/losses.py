"""The GRPO policy objective: PPO-clip with clip-higher, KL estimators, loss aggregation.

Aggregation is expressed as a per-token weight ``w`` so that the batch loss is ``sum(w * l)``
over policy tokens. The denominators are those of the *whole* optimisation batch (all
micro-batches on all learners), so summing micro-batch losses gives exactly the batch loss,
whatever the micro-batching and data-parallel split. The modes (``n_s`` = policy tokens of
sequence s, ``N`` = policy tokens of the batch, ``S`` = sequences with at least one policy token):

- ``token-mean``: ``sum_s sum_t l_st / N``. Every token counts once, so zero-advantage tokens
  sit in the denominator and dilute the informative ones (the effect the paper measures).
- ``seq-mean-token-mean``: ``(1/S) sum_s (1/n_s) sum_t l_st``. Each sequence weighs the same,
  whatever its length (the original GRPO).
- ``seq-mean-token-sum``: ``(1/S) sum_s sum_t l_st``. Longer replies weigh more; no length bias
  towards short wrong answers (Dr.GRPO uses this with a constant denominator).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def batch_denominator(mode: str, policy_tokens_per_seq: Sequence[int]) -> float:
    """The whole batch's denominator for ``mode``: N for token-mean, S for the seq-mean modes."""
    if mode == "token-mean":
        return float(max(1, sum(policy_tokens_per_seq)))
    if mode in AGGREGATIONS:
        return float(max(1, sum(1 for n in policy_tokens_per_seq if n > 0)))
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {AGGREGATIONS}")


def token_weights(mask: torch.Tensor, mode: str, denominator: float) -> torch.Tensor:
    """Weight of each token of a ``[B, T]`` micro-batch in the batch loss (0 off the mask)."""
    if not mask.is_floating_point():
        mask = mask.to(torch.float32)
    if mode == "token-mean":
        return mask / denominator
    if mode == "seq-mean-token-mean":
        return mask / (mask.sum(dim=-1, keepdim=True).clamp(min=1.0) * denominator)
    if mode == "seq-mean-token-sum":
        return mask / denominator
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {AGGREGATIONS}")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)`` and where the clip bit.

    Separate bounds are DAPO's clip-higher: a larger upper bound lets rare tokens with positive
    advantage grow, which keeps entropy from collapsing.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman's k1 and k3).

    k1 = log pi - log ref is unbiased but can be negative; k3 = exp(-k1) + k1 - 1 is unbiased,
    non-negative and lower-variance, hence the default.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; known: k1, k3")
