"""The incremental tracker equals the batch computation exactly."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selective_rollout.gate import DivergenceTracker, prefix_edit_distance

ACTION = st.sampled_from(["go to a", "go to b", "take x", "put x", "look", "open c"])


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    g=st.integers(2, 6),
    steps=st.integers(1, 12),
)
def test_incremental_equals_batch(data, g, steps):
    tracker = DivergenceTracker(g)
    seqs: list[list[str]] = [[] for _ in range(g)]
    ended = [False] * g
    for step in range(1, steps + 1):
        for i in range(g):
            if ended[i]:
                continue
            a = data.draw(ACTION)
            tracker.append(i, a)
            seqs[i].append(a)
            if data.draw(st.booleans()) and data.draw(st.booleans()):
                ended[i] = True
                tracker.end(i)
        # every step: D over the common prefix length equals the from-scratch computation
        assert tracker.distance(step) == prefix_edit_distance(seqs, step, ended)
        # and an earlier K is still readable exactly
        k = data.draw(st.integers(1, step))
        assert tracker.distance(k) == prefix_edit_distance(seqs, k, ended)


def test_ended_trajectories_get_padded_lazily():
    t = DivergenceTracker(2)
    t.append(0, "a")
    t.append(1, "a")
    t.end(0)
    t.append(1, "b")
    assert t.distance(2) == pytest.approx(0.5)  # [a, END] vs [a, b]
    assert t.length(0) == 2


def test_misuse_is_rejected():
    with pytest.raises(ValueError, match="G >= 2"):
        DivergenceTracker(1)
    t = DivergenceTracker(2)
    t.append(0, "a")
    with pytest.raises(ValueError, match="live with 0"):
        t.distance(1)
    t.end(0)
    with pytest.raises(ValueError, match="has ended"):
        t.append(0, "b")
