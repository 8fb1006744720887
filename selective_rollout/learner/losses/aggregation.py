"""Loss aggregations: how per-token losses add up to the batch loss.

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

Each mode is a class listed in ``AGGREGATIONS`` (``selective_rollout.learner.losses``) that
``trainer.loss_agg`` names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from selective_rollout.learner.losses import AGGREGATIONS
from selective_rollout.learner.losses.params import Entry


class Aggregation(Entry, ABC):
    """The batch's denominator (computed once by the driver, over the whole batch) and each
    micro-batch token's weight given that denominator (computed by the learners)."""

    @abstractmethod
    def denominator(self, policy_tokens_per_seq: Sequence[int]) -> float: ...

    def weights(self, mask: torch.Tensor, denominator: float) -> torch.Tensor:
        """Weight of each token of a float ``[B, T]`` mask; by default every policy token the same."""
        return mask / denominator


class TokenMean(Aggregation):
    """``N``: the batch's policy tokens."""

    def denominator(self, policy_tokens_per_seq: Sequence[int]) -> float:
        return float(max(1, sum(policy_tokens_per_seq)))


class SequenceMean(Aggregation):
    """``S``: the batch's sequences with at least one policy token (the two seq-mean modes)."""

    def denominator(self, policy_tokens_per_seq: Sequence[int]) -> float:
        return float(max(1, sum(1 for n in policy_tokens_per_seq if n > 0)))


class SeqMeanTokenSum(SequenceMean):
    """Each token the same weight over ``S``."""


class SeqMeanTokenMean(SequenceMean):
    """Each token divided by its own sequence's ``n_s``, then over ``S``."""

    def weights(self, mask: torch.Tensor, denominator: float) -> torch.Tensor:
        return mask / (mask.sum(dim=-1, keepdim=True).clamp(min=1.0) * denominator)


def batch_denominator(mode: str, policy_tokens_per_seq: Sequence[int]) -> float:
    """The whole batch's denominator for aggregation ``mode`` at its default parameters."""
    return AGGREGATIONS.build(mode).denominator(policy_tokens_per_seq)


def token_weights(mask: torch.Tensor, mode: str, denominator: float) -> torch.Tensor:
    """Weight of each token of a ``[B, T]`` micro-batch in the batch loss (0 off the mask)."""
    if not mask.is_floating_point():
        mask = mask.to(torch.float32)
    return AGGREGATIONS.build(mode).weights(mask, denominator)
