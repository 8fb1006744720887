"""The update check's constructed group and its verdict (``selective_rollout.driver.update_check``); the
check itself runs over real Ray, engines and learners in the cluster rehearsal and the GPU smoke."""

from __future__ import annotations

import pytest

from selective_rollout.driver.update_check import (
    REWARDS,
    UpdateCheckFailed,
    check_batch,
    served_shift,
    verdict,
)
from selective_rollout.learner.advantages import compute_advantages

PROMPT, REPLIES = [5, 6, 7], [[8, 9], [10, 11, 12]]


def logprobs() -> list[list[float]]:
    return [[-0.1 * (i + 1)] * (len(PROMPT) + len(r) - 1) for i, r in enumerate(REPLIES)]


def test_the_constructed_group_trains_only_its_replies_at_ratio_one() -> None:
    batch = check_batch(PROMPT, REPLIES, logprobs())
    assert [e.reward for e in batch] == list(REWARDS) and len({e.group_id for e in batch}) == 1
    first = batch[0]
    assert first.token_ids == [5, 6, 7, 8, 9] and first.loss_mask == [0, 0, 0, 1, 1]
    # the learner's own log-probs on the reply tokens: the importance ratio starts at 1
    assert first.old_logprobs == [0.0, 0.0, 0.0, -0.1, -0.1]
    assert batch[1].old_logprobs == [0.0, 0.0, 0.0, -0.2, -0.2, -0.2]


def test_its_rewards_differ_so_every_reply_has_an_advantage() -> None:
    advantages = compute_advantages(check_batch(PROMPT, REPLIES, logprobs()), "grpo")
    assert advantages[0] > 0 > advantages[1]


def test_log_probs_of_the_wrong_length_are_refused() -> None:
    short = logprobs()
    short[1] = short[1][:-1]
    with pytest.raises(ValueError, match="reply 1"):
        check_batch(PROMPT, REPLIES, short)


def test_the_verdict_names_what_did_not_move() -> None:
    moved = {"train/loss": 0.3, "train/grad_norm": 1.5, "train/lr": 1e-5}
    assert verdict(moved, 0.01) == {"check/loss": 0.3, "check/grad_norm": 1.5, "check/served_shift": 0.01}
    with pytest.raises(UpdateCheckFailed, match="did not reach the served weights"):
        verdict(moved, 0.0)
    with pytest.raises(UpdateCheckFailed, match="gradient norm 0"):
        verdict({**moved, "train/grad_norm": 0.0}, 0.01)
    with pytest.raises(UpdateCheckFailed, match="skipped"):
        verdict({"train/skipped": 1.0, "train/grad_norm": 0.0}, 0.0)


def test_the_shift_is_the_mean_absolute_change() -> None:
    assert served_shift([-1.0, -2.0], [-1.5, -1.0]) == pytest.approx(0.75)
    with pytest.raises(UpdateCheckFailed, match="scored over 2 and then 1"):
        served_shift([-1.0, -2.0], [-1.0])
