"""Policy losses: the per-token loss of the sampled tokens given their advantages.

Each is a class listed in ``POLICY_LOSSES`` (``selective_rollout.learner.losses``); ``trainer.policy_loss``
names the one to use and its fields are flat ``trainer.*`` keys (``trainer.clip_high``, declared
in ``losses/params.py`` so that config validation does not import torch).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from selective_rollout.learner.losses.params import DecoupledPPOParams, Entry, PPOClipParams


class PolicyLoss(Entry, ABC):
    """Maps ``[B, T]`` log-probs, old (proximal) log-probs, advantages and behaviour log-probs to
    the per-token loss and a boolean mask of the tokens it clipped (all False for a loss that
    never clips).

    The *proximal* policy is the learner before this update (``trainer.old_logprobs``); the
    *behaviour* policy is the one that sampled the tokens (``objective.behaviour_logprobs``: the
    proximal policy itself wherever the sampling weights were the current ones). A loss that
    ignores the behaviour log-probs assumes on-policy data.
    """

    # True when a token of advantage 0 adds no gradient (PPO-clip, REINFORCE): without a KL term
    # the driver then skips zero-advantage sequences exactly. False for a loss with a term that
    # does not scale with the advantage (an entropy bonus, say).
    no_gradient_at_zero_advantage: ClassVar[bool] = True

    @abstractmethod
    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        behaviour_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def weight_cap(self) -> float:
        """Where the loss truncates behaviour importance weights (inf: it does not use them)."""
        return float("inf")


def behaviour_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor) -> torch.Tensor:
    """``pi_proximal / pi_behaviour`` per token, without gradient: 1 where the two coincide."""
    return torch.exp(old_logprobs.detach() - behaviour_logprobs.detach())


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


class PPOClip(PPOClipParams, PolicyLoss):
    """PPO's clipped surrogate with DAPO's separate bounds (``ppo_clip_loss``), on-policy: the
    behaviour log-probs are not used."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        behaviour_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ppo_clip_loss(logprobs, old_logprobs, advantages, self.clip_low, self.clip_high)


class DecoupledPPO(DecoupledPPOParams, PolicyLoss):
    """Decoupled PPO (Hilton et al. 2022, as AReaL trains asynchronously): the clipped surrogate
    against the proximal policy, times the truncated behaviour importance weight
    ``min(pi_proximal / pi_behaviour, is_cap)`` (no gradient through it). Where the behaviour
    log-probs are the proximal ones (tokens sampled by the current weights) the weight is exactly
    1 and the loss is ``ppo_clip``'s."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        behaviour_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weight = behaviour_weights(old_logprobs, behaviour_logprobs).clamp(max=self.is_cap)
        per_token, clipped = ppo_clip_loss(logprobs, old_logprobs, advantages, self.clip_low, self.clip_high)
        return weight * per_token, clipped

    def weight_cap(self) -> float:
        return self.is_cap
