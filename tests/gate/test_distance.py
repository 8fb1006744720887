"""Prefix edit distance and divergence features: hand-computed values and properties."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selective_rollout.gate import (
    END,
    divergence_features,
    levenshtein_c,
    levenshtein_py,
    prefix_edit_distance,
)
from selective_rollout.gate.distance import padded_prefix

ACTIONS = st.sampled_from(["go to cabinet 1", "go to cabinet 10", "take pan 1", "open fridge 1", "look"])
GROUPS = st.lists(st.lists(ACTIONS, max_size=8), min_size=2, max_size=6)


def test_identical_prefixes_give_zero():
    seqs = [["go to sinkbasin 1", "take pan 1 from sinkbasin 1", "go to fridge 1"]] * 4
    assert prefix_edit_distance(seqs, 3) == 0.0


def test_disjoint_single_actions_give_one():
    seqs = [["search(query)"], ["lookup(item)"], ["finish(answer)"]]
    assert prefix_edit_distance(seqs, 1) == pytest.approx(1.0)
    assert prefix_edit_distance(seqs, 1) > 0.5


def test_hand_computed_pair():
    # a = x y z, b = x q z: one substitution over length 3
    assert prefix_edit_distance([["x", "y", "z"], ["x", "q", "z"]], 3) == pytest.approx(1 / 3)
    # three trajectories: d(a,b)=1/3, d(a,c)=0, d(b,c)=1/3 -> mean 2/9
    assert prefix_edit_distance([["x", "y", "z"], ["x", "q", "z"], ["x", "y", "z"]], 3) == pytest.approx(
        2 / 9
    )


def test_only_first_k_actions_count():
    seqs = [["a", "b", "c", "d"], ["a", "b", "x", "y"]]
    assert prefix_edit_distance(seqs, 2) == 0.0
    assert prefix_edit_distance(seqs, 4) == pytest.approx(0.5)


def test_ended_trajectories_are_end_padded():
    assert padded_prefix(["a"], 3) == ["a", END, END]
    # a trajectory that stopped after "a" differs from one that went on in 2 of 3 slots
    assert prefix_edit_distance([["a"], ["a", "b", "c"]], 3) == pytest.approx(2 / 3)
    # two trajectories that both ended early are alike in their padding
    assert prefix_edit_distance([["a"], ["a"]], 5) == 0.0


def test_live_short_trajectory_is_not_padded():
    d = prefix_edit_distance([["a"], ["a", "b"]], 2, ended=[False, False])
    assert d == pytest.approx(0.5)  # lengths 1 vs 2, one insertion / max len 2


def test_whole_actions_are_tokens():
    # "go to cabinet 1" vs "go to cabinet 10" differ by one character but are different actions
    assert prefix_edit_distance([["go to cabinet 1"], ["go to cabinet 10"]], 1) == 1.0


def test_bad_groups_are_rejected():
    with pytest.raises(ValueError, match="G >= 2"):
        prefix_edit_distance([["a"]], 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        prefix_edit_distance([["a"], ["b"]], 0)
    with pytest.raises(TypeError, match="one string"):
        prefix_edit_distance(["abc", "abd"], 2)


def test_features_hand_computed():
    seqs = [["a", "b"], ["a", "b"], ["a", "c"], ["d"]]
    live = [False, False, False, True]
    f = divergence_features(seqs, 2, ended=live, observations=["o1", "o1", "o2", "o3"])
    assert f["unique_prefix_ratio"] == pytest.approx(3 / 4)
    assert f["unique_action_ratio"] == pytest.approx(3 / 4)  # b, c, END
    assert f["termination_frac"] == pytest.approx(1 / 4)  # only the one-action trajectory has ended
    # offline logs hold whole trajectories: every one no longer than K has terminated by K
    assert divergence_features(seqs, 2)["termination_frac"] == 1.0
    assert f["observation_unique_ratio"] == pytest.approx(3 / 4)
    counts = [2, 1, 1]
    h = -sum(c / 4 * math.log(c / 4) for c in counts) / math.log(4)
    assert f["action_entropy"] == pytest.approx(h)
    # bigrams: {ab},{ab},{ac},{d END}: pairs ab-ab 0, ab-ac 1, ab-dE 1 (x2), ab-ac 1, ac-dE 1
    assert f["bigram_jaccard_distance"] == pytest.approx(5 / 6)


def test_converged_group_features_are_zero():
    f = divergence_features([["a", "b", "c"]] * 8, 3)
    assert f["prefix_edit_distance"] == 0.0
    assert f["bigram_jaccard_distance"] == 0.0
    assert f["action_entropy"] == 0.0
    assert f["unique_prefix_ratio"] == pytest.approx(1 / 8)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(ACTIONS, max_size=10), b=st.lists(ACTIONS, max_size=10))
def test_c_library_equals_python_reference(a, b):
    assert levenshtein_c(a, b) == levenshtein_py(a, b)


@settings(max_examples=200, deadline=None)
@given(seqs=GROUPS, k=st.integers(1, 10))
def test_distance_properties(seqs, k):
    d = prefix_edit_distance(seqs, k)
    assert 0.0 <= d <= 1.0
    assert d == pytest.approx(prefix_edit_distance(list(reversed(seqs)), k))  # symmetric in order
    prefixes = {tuple(padded_prefix(s, k)) for s in seqs}
    assert (d == 0.0) == (len(prefixes) == 1)  # zero iff all padded prefixes are equal
    assert d == pytest.approx(prefix_edit_distance(seqs, k, lev=levenshtein_py))


@settings(max_examples=100, deadline=None)
@given(seqs=GROUPS, k=st.integers(1, 10))
def test_all_features_in_unit_interval(seqs, k):
    for name, value in divergence_features(seqs, k).items():
        assert 0.0 <= value <= 1.0 + 1e-12, name
