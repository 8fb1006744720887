import math

import numpy as np
import pytest

from selective_rollout.config import load_config
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.losses import ADVANTAGES
from tests.learner.conftest import make_batch


def test_grpo_matches_hand_computation_per_group():
    batch = make_batch(0, {"a": [1.0, 0.0, 0.0, 1.0], "b": [0.5, 0.5]})
    batch = [batch[0], batch[4], batch[1], batch[2], batch[5], batch[3]]  # interleave the groups
    adv = compute_advantages(batch, "grpo")
    std = math.sqrt(sum((r - 0.5) ** 2 for r in [1, 0, 0, 1]) / 3)  # sample std
    expected_a = [(r - 0.5) / (std + 1e-6) for r in [1.0, 0.0, 0.0, 1.0]]
    assert adv[0] == pytest.approx(expected_a[0])
    assert [adv[2], adv[3], adv[5]] == pytest.approx(expected_a[1:])
    assert adv[1] == adv[4] == 0.0  # zero-variance group: no signal


def test_drgrpo_is_centred_without_std():
    batch = make_batch(1, {"g": [3.0, 1.0, 2.0]})
    assert compute_advantages(batch, "drgrpo") == pytest.approx([1.0, -1.0, 0.0])


def test_group_of_one_gets_zero_not_nan():
    for name in ADVANTAGES:
        assert ADVANTAGES.build(name)(np.array([5.0])).tolist() == [0.0], name


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages(make_batch(0, {"g": [1.0, 0.0]}), "ppo")


def test_the_run_config_binds_the_estimator_and_its_parameter():
    cfg = load_config(None, ["trainer.advantage_eps=0.5"]).trainer
    batch = make_batch(0, {"g": [1.0, 0.0]})
    std = math.sqrt(0.5)
    assert compute_advantages(batch, ADVANTAGES.build(cfg.advantage, cfg)) == pytest.approx(
        [0.5 / (std + 0.5), -0.5 / (std + 0.5)]
    )
