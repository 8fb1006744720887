"""The loss registries: lookups, config validation against them, and a new entry end to end."""

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from pydantic import Field
from transformers import AutoModelForCausalLM

from selective_rollout.config import ConfigError, load_config
from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.losses import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSS_REGISTRIES,
    POLICY_LOSSES,
    AdvantageEstimator,
    Aggregation,
    PolicyLoss,
    batch_denominator,
)
from selective_rollout.learner.losses.policy import PPOClip
from selective_rollout.learner.modeling import token_logprobs
from selective_rollout.learner.objective import micro_batch_loss
from selective_rollout.learner.packing import collate
from tests.learner.conftest import assert_same_direction_and_size, make_batch


@contextmanager
def scratch_registries() -> Iterator[None]:
    """Registrations made inside vanish on exit: every registry works on a copy of its entries."""
    with pytest.MonkeyPatch.context() as mp:
        for registry in LOSS_REGISTRIES.values():
            mp.setattr(registry, "_entries", dict(registry._entries))
        yield


def register_reinforce() -> None:
    @POLICY_LOSSES.register("toy_reinforce")
    class Reinforce(PolicyLoss):
        """``-scale * A * log pi``: the plain policy gradient, no ratio, never clips."""

        reinforce_scale: float = Field(1.0, gt=0.0, description="toy_reinforce: multiplies the loss")

        def __call__(
            self,
            logprobs: torch.Tensor,
            old_logprobs: torch.Tensor,
            advantages: torch.Tensor,
            behaviour_logprobs: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            del old_logprobs, behaviour_logprobs
            return -self.reinforce_scale * advantages * logprobs, torch.zeros_like(logprobs, dtype=torch.bool)


def register_token_sum() -> None:
    @AGGREGATIONS.register("toy-token-sum")
    class TokenSum(Aggregation):
        """The plain sum of the per-token losses."""

        def denominator(self, policy_tokens_per_seq: list[int]) -> float:
            del policy_tokens_per_seq
            return 1.0


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


def test_lookups_and_the_clear_error():
    assert POLICY_LOSSES.get("ppo_clip") is PPOClip
    assert sorted(AGGREGATIONS) == ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"]
    assert sorted(KL_ESTIMATORS) == ["k1", "k3"]
    with pytest.raises(ValueError, match=r"^unknown loss aggregation 'x'; known: seq-mean-token-mean, "):
        AGGREGATIONS.get("x")
    with pytest.raises(ValueError, match="policy loss 'ppo_clip' is registered twice"):
        POLICY_LOSSES.register("ppo_clip")(PPOClip)


def test_the_config_defaults_are_registered_and_bind_their_parameters():
    cfg = TrainerConfig(clip_high=0.5)
    for key, registry in LOSS_REGISTRIES.items():
        registry.get(getattr(cfg, key))
    assert POLICY_LOSSES.build(cfg.policy_loss, cfg) == PPOClip(clip_low=0.2, clip_high=0.5)
    assert set(TrainerConfig.own_params("ppo_clip", "policy_loss")) == {"clip_low", "clip_high"}


def test_flat_parameter_keys_keep_working():
    cfg = load_config(None, ["trainer.clip_high=0.4", "trainer.loss_agg=seq-mean-token-sum"]).trainer
    assert (cfg.clip_low, cfg.clip_high, cfg.loss_agg, cfg.policy_loss) == (
        0.2,
        0.4,
        "seq-mean-token-sum",
        "ppo_clip",
    )


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "trainer.loss_agg=bogus",
            r"trainer\.loss_agg: unknown loss aggregation 'bogus'; known: seq-mean-token-mean",
        ),
        ("trainer.kl_estimator=k2", r"trainer\.kl_estimator: unknown KL estimator 'k2'; known: k1, k3"),
        (
            "trainer.policy_loss=gspo",
            r"trainer\.policy_loss: unknown policy loss 'gspo'; known: decoupled_ppo, ppo_clip",
        ),
        ("trainer.clip_hgih=0.3", r"trainer\.clip_hgih: unknown key"),
        ("trainer.clip_low=1.5", r"trainer\.clip_low must be < 1\.0 \(got 1\.5\)"),
    ],
)
def test_bad_loss_settings_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(None, [override])
    assert "\n" not in str(info.value)


def test_a_parameter_of_a_loss_not_selected_is_refused_naming_its_owner():
    """Loss components are entries of the trainer section like gates of the gate section: only
    the selected ones' parameters are keys, and a stray one says which component owns it."""
    with pytest.raises(ConfigError, match=r"trainer\.is_cap: policy loss 'ppo_clip' has no such parameter"):
        load_config(None, ["trainer.is_cap=3"])
    cfg = load_config(None, ["trainer.policy_loss=decoupled_ppo", "trainer.is_cap=3"]).trainer
    assert (cfg.is_cap, cfg.clip_high) == (3.0, 0.28)
    switched = load_config(
        None, ["trainer.policy_loss=decoupled_ppo", "trainer.is_cap=3"], [["trainer.policy_loss=ppo_clip"]]
    )
    assert (
        "is_cap" not in switched.trainer.model_dump()
    )  # a later layer's selection drops the old entry's keys


def test_a_registered_toy_loss_is_selected_by_config_and_trains(model):
    """One class with a decorator is a new loss: config accepts its name and its parameter, and
    micro_batch_loss computes exactly the loss and gradient the class defines."""
    batch = make_batch(2, {"a": [1.0, 0.0, 1.0, 0.0]})
    adv = compute_advantages(batch, "grpo")
    mb = collate(batch, adv)
    with scratch_registries():
        register_reinforce()
        cfg = load_config(None, ["trainer.policy_loss=toy_reinforce", "trainer.reinforce_scale=2.0"]).trainer
        denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])
        model.zero_grad()
        loss, stats = micro_batch_loss(model, mb, cfg, denom)
        loss.backward()
    got = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    logprobs = token_logprobs(model, mb.input_ids, mb.attention_mask).logprobs
    expected = (-2.0 * mb.advantages * logprobs * mb.loss_mask).sum() / denom
    expected.backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    assert_same_direction_and_size(got, want)
    assert stats["clip_sum"] == 0.0
    assert "toy_reinforce" not in POLICY_LOSSES
    with pytest.raises(ConfigError, match=r"trainer\.reinforce_scale: unknown key"):
        load_config(None, ["trainer.reinforce_scale=2.0"])


def test_a_registered_toy_aggregation_is_selected_by_config(model):
    batch = make_batch(3, {"a": [1.0, 0.0, 0.5], "b": [0.0, 1.0, 1.0]})
    adv = compute_advantages(batch, "grpo")
    mb = collate(batch, adv)
    tokens = [e.num_policy_tokens for e in batch]
    mean, _ = micro_batch_loss(model, mb, TrainerConfig(), batch_denominator("token-mean", tokens))
    with scratch_registries():
        register_token_sum()
        cfg = load_config(None, ["trainer.loss_agg=toy-token-sum"]).trainer
        total, _ = micro_batch_loss(model, mb, cfg, AGGREGATIONS.build(cfg.loss_agg, cfg).denominator(tokens))
    assert total.item() == pytest.approx(mean.item() * sum(tokens), rel=1e-9)
    assert "toy-token-sum" not in AGGREGATIONS


def register_rank_advantage() -> None:
    @ADVANTAGES.register("toy_rank")
    class Rank(AdvantageEstimator):
        """Centred ranks of the rewards, times a scale: robust to reward outliers."""

        rank_scale: float = Field(1.0, gt=0.0, description="toy_rank: multiplies the centred ranks")

        def __call__(self, rewards: np.ndarray) -> np.ndarray:
            ranks = rewards.argsort().argsort().astype(np.float64)
            return self.rank_scale * (ranks - ranks.mean())


def test_a_registered_toy_advantage_is_selected_by_config_and_trains(model):
    """One decorated class is a new advantage estimator: config accepts its name and parameter,
    and the learner's loss is computed from the advantages it gives."""
    batch = make_batch(4, {"a": [0.0, 10.0, 1.0], "b": [2.0, 2.0, 2.0]})
    with scratch_registries():
        register_rank_advantage()
        cfg = load_config(None, ["trainer.advantage=toy_rank", "trainer.rank_scale=2.0"]).trainer
        adv = compute_advantages(batch, ADVANTAGES.build(cfg.advantage, cfg))
    assert adv == pytest.approx([-2.0, 2.0, 0.0, -2.0, 0.0, 2.0])  # ties ranked by position
    mb = collate(batch, adv)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])
    loss, _ = micro_batch_loss(model, mb, cfg, denom)
    assert torch.isfinite(loss) and loss.item() != 0.0
    assert "toy_rank" not in ADVANTAGES
    with pytest.raises(ConfigError, match=r"trainer\.advantage: unknown advantage estimator 'toy_rank'"):
        load_config(None, ["trainer.advantage=toy_rank"])
