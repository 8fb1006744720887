import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.losses import batch_denominator, kl_estimate, ppo_clip_loss, token_weights
from selective_rollout.learner.objective import micro_batch_loss
from selective_rollout.learner.packing import collate, plan_micro_batches
from tests.learner.conftest import assert_same_direction_and_size, make_batch

# two sequences: 3 and 1 policy tokens (one padded position); clip 0.2 / 0.28
LOGP = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, 0.0, 0.0]])
OLD = torch.tensor([[-1.1, -1.0, -2.0], [-0.1, 0.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def hand_token_losses() -> list[list[float]]:
    out = []
    for s in range(2):
        row = []
        for t in range(3):
            if not MASK[s, t]:
                continue
            rho = math.exp(LOGP[s, t].item() - OLD[s, t].item())
            a = ADV[s, t].item()
            row.append(-min(rho * a, min(max(rho, 0.8), 1.28) * a))
        out.append(row)
    return out


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", lambda ls: sum(map(sum, ls)) / 4),
        ("seq-mean-token-mean", lambda ls: (sum(ls[0]) / 3 + sum(ls[1]) / 1) / 2),
        ("seq-mean-token-sum", lambda ls: (sum(ls[0]) + sum(ls[1])) / 2),
    ],
)
def test_aggregated_loss_equals_hand_computation(mode, expected):
    per_token, _ = ppo_clip_loss(LOGP, OLD, ADV, 0.2, 0.28)
    denom = batch_denominator(mode, [3, 1])
    loss = (per_token * token_weights(MASK, mode, denom)).sum().item()
    assert loss == pytest.approx(expected(hand_token_losses()), rel=1e-6)


def test_clip_higher_bounds_are_separate():
    logp = torch.tensor([math.log(1.5), math.log(0.5)])
    per_token, clipped = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), 0.2, 0.28)
    assert per_token.tolist() == pytest.approx([-1.28, 0.8])
    assert clipped.tolist() == [True, True]


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    with pytest.raises(ValueError, match="KL estimator 'k2'"):
        kl_estimate(logp, ref, "k2")


def flat_grad(model, batch, cfg) -> tuple[torch.Tensor, float]:
    model.zero_grad()
    adv = compute_advantages(batch, cfg.advantage)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])
    loss, _ = micro_batch_loss(model, collate(batch, adv), cfg, denom)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), loss.item()


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


def test_zero_advantage_groups_give_no_gradient(model):
    cfg = TrainerConfig()
    g, _ = flat_grad(model, make_batch(3, {"z1": [1.0] * 4, "z2": [0.0] * 4}), cfg)
    assert g.abs().max().item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_zero_advantage_groups_only_dilute(model, mode):
    """Adding zero-variance groups scales the informative gradient by the denominator ratio, nothing else."""
    cfg = TrainerConfig(loss_agg=mode)
    informative = make_batch(4, {"a": [1.0, 0.0, 1.0, 0.0]})
    zero = make_batch(5, {"z": [1.0] * 4})
    g_inf, _ = flat_grad(model, informative, cfg)
    g_all, _ = flat_grad(model, informative + zero, cfg)
    ratio = batch_denominator(mode, [e.num_policy_tokens for e in informative]) / batch_denominator(
        mode, [e.num_policy_tokens for e in informative + zero]
    )
    assert g_inf.abs().max().item() > 0
    assert_same_direction_and_size(g_all, g_inf * ratio)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_losses_sum_to_the_batch_loss(model, mode):
    cfg = TrainerConfig(loss_agg=mode)
    batch = make_batch(6, {"a": [1.0, 0.0, 0.5], "b": [0.0, 1.0, 1.0]}, turns=4)
    adv = compute_advantages(batch, cfg.advantage)
    denom = batch_denominator(mode, [e.num_policy_tokens for e in batch])
    whole, _ = micro_batch_loss(model, collate(batch, adv), cfg, denom)
    plans = plan_micro_batches([len(e.token_ids) for e in batch], token_budget=60)
    assert len(plans) > 1
    parts = [
        micro_batch_loss(model, collate([batch[i] for i in p], [adv[i] for i in p]), cfg, denom)[0]
        for p in plans
    ]
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=1e-10)


def with_engine_noise(batch: list, seed: int) -> list:
    """``batch`` with standard-normal noise added to the engine's log-probs."""
    gen = torch.Generator().manual_seed(seed)
    return [
        dataclasses.replace(
            e, old_logprobs=[lp + float(torch.randn(1, generator=gen)) for lp in e.old_logprobs]
        )
        for e in batch
    ]


def test_learner_old_logprobs_ignore_the_engines_numerics(model):
    """old_logprobs=learner: the ratio is exactly 1 before the batch's one update, so noise in the
    engine's log-probs (bf16 rounding, other kernels) changes neither the loss nor its gradient
    and never clips; it only shows as the engine-learner gap. With old_logprobs=engine it does."""
    batch = make_batch(4, {"a": [1.0, 0.0, 1.0, 0.0]})
    noisy = with_engine_noise(batch, seed=0)
    learner = TrainerConfig(old_logprobs="learner")
    g_exact, loss_exact = flat_grad(model, batch, learner)
    g_noisy, loss_noisy = flat_grad(model, noisy, learner)
    assert torch.allclose(g_exact, g_noisy) and loss_exact == pytest.approx(loss_noisy)
    adv = compute_advantages(noisy, "grpo")
    denom = batch_denominator("token-mean", [e.num_policy_tokens for e in noisy])
    _, stats = micro_batch_loss(model, collate(noisy, adv), learner, denom)
    assert stats["clip_sum"] == 0.0 and stats["engine_gap_sum"] > 0.0
    g_engine, _ = flat_grad(model, noisy, TrainerConfig(old_logprobs="engine"))
    assert not torch.allclose(g_engine, g_exact)


def stale_grad(model, batch, cfg, staleness) -> tuple[torch.Tensor, float, dict[str, float]]:
    model.zero_grad()
    adv = compute_advantages(batch, cfg.advantage)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])
    lags = [[lag] * len(e.token_ids) for e, lag in zip(batch, staleness, strict=True)]
    loss, stats = micro_batch_loss(model, collate(batch, adv, staleness=lags), cfg, denom)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return grad, loss.item(), stats


def test_decoupled_ppo_is_ppo_clip_exactly_at_staleness_0(model):
    """Fresh tokens take the proximal log-probs as their behaviour: weight 1, whatever the engine's
    log-probs say (here noise), so the loss and gradient are ppo_clip's, bit for bit."""
    batch = make_batch(4, {"a": [1.0, 0.0, 1.0, 0.0]})
    noisy = with_engine_noise(batch, seed=1)
    g_ppo, loss_ppo, _ = stale_grad(model, noisy, TrainerConfig(), [0] * 4)
    g_dec, loss_dec, stats = stale_grad(model, noisy, TrainerConfig(policy_loss="decoupled_ppo"), [0] * 4)
    assert torch.equal(g_ppo, g_dec) and loss_ppo == loss_dec
    assert stats["stale_tokens"] == 0.0


def test_decoupled_ppo_weighs_stale_tokens_by_the_truncated_behaviour_ratio(model):
    """Stale tokens: each token's loss is scaled by min(pi_proximal / pi_behaviour, is_cap). With
    behaviour log-probs 1 nat below the proximal ones on one sequence (weight e, truncated to 2)
    and 0.5 nat above on another (weight e^-0.5), the gradient is ppo_clip's with those sequences'
    advantages scaled by their weights (the ratio to the proximal policy is 1: nothing clips), and
    the statistics count what was truncated."""
    from selective_rollout.learner.objective import acting_logprobs

    cfg = TrainerConfig(policy_loss="decoupled_ppo", is_cap=2.0)
    batch = make_batch(4, {"a": [1.0, 0.0, 1.0, 0.0]})
    adv = compute_advantages(batch, cfg.advantage)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])
    with torch.no_grad():
        lp = acting_logprobs(model, collate(batch, adv), cfg).logprobs
    shifts = [-1.0, 0.5, 3.0, 3.0]  # behaviour = proximal + shift on the policy tokens
    behaved = []
    for row, (e, shift) in enumerate(zip(batch, shifts, strict=True)):
        engine = [0.0] + [float(lp[row, t]) + shift for t in range(len(e.token_ids) - 1)]
        behaved.append(
            dataclasses.replace(e, old_logprobs=[v * m for v, m in zip(engine, e.loss_mask, strict=True)])
        )
    staleness = [1, 1, 0, 0]  # rows 2 and 3 fresh: their shifted engine log-probs are ignored
    g_dec, _, stats = stale_grad(model, behaved, cfg, staleness)
    weights = [2.0, math.exp(-0.5), 1.0, 1.0]
    model.zero_grad()
    scaled = collate(behaved, [a * w for a, w in zip(adv, weights, strict=True)])
    micro_batch_loss(model, scaled, TrainerConfig(), denom)[0].backward()
    g_scaled = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    # the engine's log-probs are stored in float32: weights agree to its rounding
    assert torch.allclose(g_dec, g_scaled, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(g_dec, stale_grad(model, behaved, TrainerConfig(), staleness)[0], rtol=1e-3)
    assert stats["stale_tokens"] == behaved[0].num_policy_tokens + behaved[1].num_policy_tokens
    assert stats["is_truncated"] == behaved[0].num_policy_tokens
    assert stats["is_max"] == pytest.approx(math.e, rel=1e-5)
    expected = 2.0 * behaved[0].num_policy_tokens + math.exp(-0.5) * behaved[1].num_policy_tokens
    assert stats["is_sum"] == pytest.approx(expected, rel=1e-5)
