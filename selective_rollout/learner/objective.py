"""The loss of one micro-batch and the sums the learner reports (no DeepSpeed, so unit-testable).

Every statistic is returned as a *sum* over the micro-batch's policy tokens, never a mean, so
the driver can add the sums of all micro-batches on all learners and divide once by the
batch's counts: the reported figures do not depend on how the batch was split.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from selective_rollout.learner.losses.policy import behaviour_weights
from selective_rollout.learner.modeling import TokenLogprobs, token_logprobs
from selective_rollout.learner.packing import MicroBatch

RefLogprobs = Callable[[MicroBatch], torch.Tensor]
ZERO_ADV = 1e-12
MAX_STATS = frozenset({"is_max"})  # statistics reduced by max over micro-batches and learners, not summed


def acting_logprobs(
    model: torch.nn.Module, mb: MicroBatch, cfg: TrainerConfig, with_entropy: bool = False
) -> TokenLogprobs:
    """``model``'s log-probs at the micro-batch's policy tokens under the policy that acted: with
    ``trainer.constrained_logprobs``, renormalised over what a constrained choice allowed (its
    ``allowed_mass`` already taken off ``logprobs``); else the model's own."""
    out = token_logprobs(
        model,
        mb.input_ids,
        mb.attention_mask,
        with_entropy=with_entropy,
        positions=mb.loss_mask > 0,
        choice_ids=mb.choice_ids if cfg.constrained_logprobs else None,
    )
    if out.allowed_mass is None:
        return out
    return out._replace(logprobs=out.logprobs - out.allowed_mass)


def micro_batch_loss(
    model: torch.nn.Module,
    mb: MicroBatch,
    cfg: TrainerConfig,
    denominator: float,
    ref_logprobs: RefLogprobs | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the batch loss, and its statistic sums.

    The policy loss, aggregation and KL estimator are the registry entries the config names,
    bound to their ``trainer.*`` parameters. ``denominator`` is the whole batch's (the
    aggregation's ``denominator``, computed by the driver). With ``kl_coef > 0``
    the KL is to ``ref_logprobs`` (the frozen initial policy) and enters the loss; otherwise
    ``kl_sum`` measures the drift from the sampling engine's policy (``mb.old_logprobs``), logged only.
    Log-probs are computed at the policy tokens only (``positions``); every other position weighs 0.
    They are the acting policy's (``acting_logprobs``); the engine's log-probs are the model's
    unconstrained ones, so they are moved onto the constrained choice by the learner's log-mass of
    the allowed tokens (a constant: it leaves the engine-learner gap and the drift as they were).

    The learner takes one optimiser step per batch, so before it the learner's own log-probs *are*
    the old policy: with ``old_logprobs: learner`` the ratio is exactly 1 (its gradient is the
    policy gradient), and the engine's log-probs only measure the engine-learner gap
    (``engine_gap_sum``: bf16 engines and vLLM kernels round differently from the learner).
    """
    mask = mb.loss_mask
    logprobs, entropy, allowed_mass = acting_logprobs(model, mb, cfg, with_entropy=True)
    engine = mb.old_logprobs if allowed_mass is None else mb.old_logprobs - allowed_mass.detach() * mask
    old = logprobs.detach() if cfg.old_logprobs == "learner" else engine
    behaviour = behaviour_logprobs(old, engine, mb.stale)
    policy_loss = POLICY_LOSSES.build(cfg.policy_loss, cfg)
    kl_estimator = KL_ESTIMATORS.build(cfg.kl_estimator, cfg)
    per_token, clipped = policy_loss(logprobs, old, mb.advantages, behaviour)
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("trainer.kl_coef > 0 needs a reference policy")
        kl = kl_estimator(logprobs - ref_logprobs(mb))
        per_token = per_token + cfg.kl_coef * kl
    else:
        kl = kl_estimator(logprobs.detach() - engine)
    weights = AGGREGATIONS.build(cfg.loss_agg, cfg).weights(mask.to(per_token.dtype), denominator)
    loss = (per_token * weights).sum()
    assert entropy is not None
    stats = {
        "loss_sum": float(loss.detach()),
        "policy_tokens": float(mask.sum()),
        "zero_adv_tokens": float(((mb.advantages.abs() <= ZERO_ADV) * mask).sum()),
        "kl_sum": float((kl.detach() * mask).sum()),
        "entropy_sum": float((entropy * mask).sum()),
        "clip_sum": float((clipped * mask).sum()),
        "engine_gap_sum": float(((logprobs.detach() - engine).abs() * mask).sum()),
        "signal_sq_sum": float(((weights * mb.advantages) ** 2).sum()),
        "padded_tokens": float(mb.padded_tokens),
        "tokens": float(mb.attention_mask.sum()),
        **weight_stats(behaviour_weights(old, behaviour), mask * mb.stale, policy_loss.weight_cap()),
    }
    return loss, stats


def behaviour_logprobs(old: torch.Tensor, engine: torch.Tensor, stale: torch.Tensor) -> torch.Tensor:
    """The log-probs of the policy that sampled each token: the engine's where its weights lagged
    the learner's (``stale`` > 0), the proximal policy's own (``old``) elsewhere, so that fresh
    tokens carry an importance weight of exactly 1 and the engine-learner rounding gap is measured
    (``engine_gap_sum``), not corrected.

    The engine's are the model's log-probs at temperature 1 (what the transformers engine
    returns; vLLM's with ``rescore_choices``), moved onto a constrained choice by the *proximal*
    policy's allowed mass (``micro_batch_loss``): exact for free-text tokens, and for a constrained
    choice exact up to the change of the allowed mass between the two policies."""
    return torch.where(stale > 0, engine, old)


def weight_stats(weights: torch.Tensor, stale_mask: torch.Tensor, cap: float) -> dict[str, float]:
    """Sums over the stale policy tokens of their behaviour importance weights, truncated at ``cap``
    as the loss applies them, for the learner's off-policy metrics (``offpolicy/*``)."""
    on = stale_mask > 0
    truncated = weights.clamp(max=cap)
    return {
        "stale_tokens": float(on.sum()),
        "is_sum": float(truncated[on].sum()),
        "is_sq_sum": float((truncated[on] ** 2).sum()),
        "is_max": float(weights[on].max()) if bool(on.any()) else 0.0,
        "is_truncated": float((weights[on] > cap).sum()),
    }
