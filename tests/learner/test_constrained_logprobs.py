"""The learner trains the policy that acted when decoding was constrained to a choice of commands.

Under constrained choice the acting policy is the model renormalised over the tokens the choice
allows: a forced token (one legal id) has probability 1 whatever the weights, a decision token
``p(a) / sum_allowed p``. These tests pin the pieces: which tokens stay in the loss, where the
choice ids land in a micro-batch, the allowed log-mass against a full softmax, and the loss's
gradient against a hand-written constrained policy gradient.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.losses import batch_denominator
from selective_rollout.learner.modeling import token_logprobs
from selective_rollout.learner.objective import micro_batch_loss
from selective_rollout.learner.packing import collate, per_step_segments
from selective_rollout.records import Experience
from tests.learner.conftest import VOCAB, assert_same_direction_and_size, dialogue, with_choices


def batch(seed: int = 0) -> list[Experience]:
    rng = random.Random(seed)
    rewards = [1.0, 0.0, 0.0, 1.0]
    return [with_choices(dialogue(rng, 3, "g", r), rng) for r in rewards]


def test_only_the_decision_tokens_stay_in_the_loss():
    exp = batch()[0]
    kept = exp.without_forced_tokens()
    decisions = [pos for pos, allowed in exp.choice_sets.items() if len(allowed) > 1]
    assert [i for i, m in enumerate(kept.loss_mask) if m] == decisions
    assert len(decisions) == 3 and exp.num_policy_tokens > 3  # one decision per reply, the rest forced
    plain = Experience(**{**vars(exp), "choice_sets": {}})
    assert plain.without_forced_tokens() is plain


def test_a_choice_set_without_the_token_there_is_refused():
    exp = batch()[0]
    pos = next(iter(exp.choice_sets))
    wrong = (exp.token_ids[pos] + 1) % VOCAB
    with pytest.raises(ValueError, match=f"choice set at position {pos} must hold the token"):
        Experience(**{**vars(exp), "choice_sets": {pos: (wrong,)}})


def test_choice_ids_sit_at_the_predicted_position_padded_with_minus_one():
    exps = batch()
    mb = collate(exps, [0.0] * len(exps))
    assert mb.choice_ids.shape == (*mb.loss_mask.shape, 3)
    for row, exp in enumerate(exps):
        for pos in range(1, len(exp.token_ids)):
            want = list(exp.choice_sets.get(pos, ()))
            got = [t for t in mb.choice_ids[row, pos - 1].tolist() if t >= 0]
            assert got == want
    # a per-step view keeps the choice sets of the reply it ends on, and only those
    for seg in per_step_segments(exps[0]):
        assert set(seg.choice_sets) == {i for i, m in enumerate(seg.loss_mask) if m}


def test_allowed_mass_is_the_log_probability_of_the_allowed_tokens(tiny_model_dir):
    """Against a full softmax: log sum_allowed p where a choice was made, exactly 0 elsewhere; a
    forced token's constrained log-prob is 0 with a zero gradient, and no position yields NaN."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    exps = batch()
    mb = collate(exps, [0.0] * len(exps))
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
    probs = torch.softmax(logits, dim=-1).detach()
    listed = mb.choice_ids >= 0
    want = torch.where(
        listed.any(-1),
        (probs.gather(-1, mb.choice_ids.clamp(min=0)) * listed).sum(-1).log(),
        torch.zeros(()),
    )
    for chunk, positions in [(10_000, None), (5, mb.loss_mask > 0)]:
        model.zero_grad()
        out = token_logprobs(
            model,
            mb.input_ids,
            mb.attention_mask,
            chunk_tokens=chunk,
            positions=positions,
            choice_ids=mb.choice_ids,
        )
        assert out.allowed_mass is not None
        at = mb.loss_mask > 0 if positions is not None else torch.ones_like(want, dtype=torch.bool)
        torch.testing.assert_close(out.allowed_mass[at], want[at])
        forced = listed.sum(-1) == 1
        acting = out.logprobs - out.allowed_mass
        assert (acting[forced] == 0).all()
        acting[forced].sum().backward(retain_graph=True)
        assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters())
        model.zero_grad()
        acting.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_loss_is_the_policy_gradient_of_the_constrained_policy(tiny_model_dir):
    """Gradient of ``micro_batch_loss`` with constrained log-probs = that of the hand-written
    seq-mean-token-mean of ``-A log(p(a) / sum_allowed p)`` over decision tokens; the engine gap
    and drift statistics stay those of the model's own log-probs."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    cfg = TrainerConfig(loss_agg="seq-mean-token-mean")
    exps = [e.without_forced_tokens() for e in batch()]
    adv = compute_advantages(exps)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in exps])
    mb = collate(exps, adv)

    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
    listed = mb.choice_ids >= 0
    picked = logp.gather(-1, mb.choice_ids.clamp(min=0)).masked_fill(~listed, -torch.inf)
    acting = chosen - torch.logsumexp(picked, dim=-1).nan_to_num(neginf=0.0)
    per_seq = (-(mb.advantages * acting) * mb.loss_mask).sum(-1) / mb.loss_mask.sum(-1)
    model.zero_grad()
    (per_seq.sum() / denom).backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters()])

    model.zero_grad()
    micro_batch_loss(model, mb, cfg, denom)[0].backward()
    got = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert_same_direction_and_size(got, want)

    plain = TrainerConfig(loss_agg="seq-mean-token-mean", constrained_logprobs=False)
    model.zero_grad()
    micro_batch_loss(model, mb, plain, denom)[0].backward()
    unconstrained = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.nn.functional.cosine_similarity(got, unconstrained, dim=0) < 0.99  # a different objective

    # with the engine's (unconstrained) log-probs as the old policy, the ratio, and so the clipping,
    # the engine gap and the drift are those of the model's own log-probs
    by_mode = [
        micro_batch_loss(
            model, mb, cfg.model_copy(update=dict(old_logprobs="engine", constrained_logprobs=c)), denom
        )[1]
        for c in (True, False)
    ]
    assert by_mode[0]["clip_sum"] > 0  # the synthetic engine log-probs are far off: clipping happens
    for key in ("engine_gap_sum", "kl_sum", "clip_sum", "policy_tokens"):
        assert by_mode[0][key] == pytest.approx(by_mode[1][key], rel=1e-9, abs=1e-12)
