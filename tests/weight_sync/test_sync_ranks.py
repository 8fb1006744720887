"""Weight-sync rank arithmetic: one rank per engine worker, the learner at 0 (issue 14)."""

from __future__ import annotations

import pytest

from selective_rollout.weight_sync.collective import sync_ranks


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("engines", [1, 2, 3])
def test_every_worker_of_every_engine_has_its_own_rank(tp: int, engines: int) -> None:
    firsts, world = sync_ranks([tp] * engines)
    assert world == 1 + engines * tp
    assert firsts == [1 + i * tp for i in range(engines)]
    ranks = [first + worker for first in firsts for worker in range(tp)]  # vllm_worker's rule
    assert sorted(ranks) == list(range(1, world))  # no rank shared, none left out, 0 is the learner's


def test_engines_of_different_sizes_pack_their_ranks() -> None:
    assert sync_ranks([2, 1, 4]) == ([1, 3, 4], 8)


def test_an_engine_without_workers_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        sync_ranks([1, 0])
