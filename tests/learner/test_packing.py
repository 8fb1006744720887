import pytest
import torch
from transformers import AutoModelForCausalLM

from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.losses import batch_denominator
from selective_rollout.learner.objective import micro_batch_loss
from selective_rollout.learner.packing import (
    collate,
    empty_micro_batch,
    per_step_segments,
    plan_micro_batches,
)
from selective_rollout.records import Experience
from tests.learner.conftest import assert_same_direction_and_size, make_batch


def test_plan_respects_budget_and_covers_every_sequence():
    lengths = [10, 3, 7, 7, 25, 1, 9]
    plans = plan_micro_batches(lengths, token_budget=20)
    assert sorted(i for p in plans for i in p) == list(range(len(lengths)))
    for p in plans:
        assert len(p) == 1 or len(p) * max(lengths[i] for i in p) <= 20


def test_collate_aligns_targets_and_pads_right():
    exp = Experience("g", "t", "x", [5, 6, 7, 8], [0, 1, 1, 0], [0.0, -1.0, -2.0, 0.0], 1.0)
    short = Experience("g", "t", "x", [9, 4], [0, 1], [0.0, -0.5], 0.0)
    mb = collate([exp, short], [2.0, -1.0])
    assert mb.input_ids.tolist() == [[5, 6, 7, 8], [9, 4, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert mb.loss_mask.tolist() == [[1, 1, 0], [1, 0, 0]]
    assert mb.old_logprobs.tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]
    assert mb.advantages.tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    assert mb.stale.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    # staleness is per token (a reply may span an update), kept on policy tokens only
    assert collate([exp, short], [2.0, -1.0], staleness=[[9, 2, 1, 9], [9, 1]]).stale.tolist() == [
        [2.0, 1.0, 0.0],
        [1.0, 0.0, 0.0],
    ]


def test_token_lags_take_each_tokens_version_and_refuse_one_newer_than_the_learner():
    spanned = Experience(
        "g",
        "t",
        "x",
        [5, 6, 7, 8],
        [0, 1, 1, 0],
        [0.0, -1.0, -2.0, 0.0],
        1.0,
        policy_version=3,
        token_versions=[-1, 3, 4, -1],
    )
    assert spanned.token_lags(4) == [0, 1, 0, 0]  # the reply spanned an update: one token is fresh
    plain = Experience("g", "t", "x", [5, 6, 7], [0, 1, 1], [0.0, -1.0, -2.0], 1.0, policy_version=2)
    assert plain.token_lags(4) == [0, 2, 2]  # no per-token versions: the group's
    with pytest.raises(ValueError, match="a token of policy version 4 is newer than the learner's version 3"):
        spanned.token_lags(3)
    with pytest.raises(ValueError, match="token_versions"):
        Experience("g", "t", "x", [5, 6], [0, 1], [0.0, -1.0], 1.0, token_versions=[1])


def test_first_token_cannot_be_a_policy_token():
    bad = Experience("g7", "t", "x", [1, 2], [1, 1], [-1.0, -1.0], 0.0)
    with pytest.raises(ValueError, match="group g7: the first token cannot be a policy token"):
        collate([bad], [1.0])


def test_per_step_segments_hold_the_history_before_each_reply():
    exp = Experience("g", "t", "x", [1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 0], [0, -1, -2, 0, -3, 0], 1.0)
    segs = per_step_segments(exp)
    assert [s.token_ids for s in segs] == [[1, 2, 3], [1, 2, 3, 4, 5]]
    assert [s.loss_mask for s in segs] == [[0, 1, 1], [0, 0, 0, 0, 1]]
    assert segs[1].old_logprobs == [0, 0, 0, 0, -3]


def test_packing_gives_the_loss_and_gradient_of_per_step_forwards(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    cfg = TrainerConfig(loss_agg="token-mean")
    batch = make_batch(7, {"a": [1.0, 0.0, 1.0]}, turns=4)
    adv = compute_advantages(batch, cfg.advantage)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])

    def loss_and_grad(exps, advs):
        model.zero_grad()
        loss, _ = micro_batch_loss(model, collate(exps, advs), cfg, denom)
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    packed_loss, packed_grad = loss_and_grad(batch, adv)
    steps, step_adv = [], []
    for e, a in zip(batch, adv, strict=True):
        segs = per_step_segments(e)
        steps += segs
        step_adv += [a] * len(segs)
    assert len(steps) == 4 * len(batch)
    step_loss, step_grad = loss_and_grad(steps, step_adv)
    assert packed_loss == pytest.approx(step_loss, rel=1e-10)
    assert_same_direction_and_size(packed_grad, step_grad)


def test_empty_micro_batch_has_zero_loss_and_zero_gradient(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loss, stats = micro_batch_loss(model, empty_micro_batch(), TrainerConfig(), 10.0)
    loss.backward()
    assert loss.item() == 0.0 and stats["policy_tokens"] == 0.0
    assert all(p.grad is not None and p.grad.abs().max() == 0 for p in model.parameters())
