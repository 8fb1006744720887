"""Divergence features of a group at step K (the paper's D_K and its companions).

The paper measured several; prefix edit distance is the gate's, the rest serve analysis and
richer gates. All are in [0, 1], 0 meaning "the G trajectories look alike".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import combinations, pairwise

from selective_rollout.gate.distance import END, check_group, intern, mean_pairwise_distance, padded_prefix


def _bigrams(seq: Sequence[int]) -> set[tuple[int, int]]:
    return set(pairwise(seq))


def bigram_jaccard_distance(prefixes: Sequence[Sequence[int]]) -> float:
    """Mean pairwise 1 - |A & B| / |A | B| over action-bigram sets (0 when both are empty)."""
    sets = [_bigrams(p) for p in prefixes]
    dists = []
    for a, b in combinations(sets, 2):
        union = a | b
        dists.append(1.0 - len(a & b) / len(union) if union else 0.0)
    return sum(dists) / len(dists)


def normalised_entropy(items: Sequence[object]) -> float:
    """Shannon entropy of the items' empirical distribution divided by log(len(items))."""
    n = len(items)
    if n < 2:
        return 0.0
    counts = Counter(items).values()
    h = -sum(c / n * math.log(c / n) for c in counts)
    return h / math.log(n)


def termination_frac(
    action_seqs: Sequence[Sequence[str]], k: int, ended: Sequence[bool] | None = None
) -> float:
    """The share of trajectories that ended within their first ``k`` steps (``ended`` as in
    :func:`prefix_edit_distance`: by default, as in logs of whole groups, a shorter one has)."""
    ends = [True] * len(action_seqs) if ended is None else ended
    return sum(1 for a, e in zip(action_seqs, ends, strict=True) if e and len(a) <= k) / len(action_seqs)


def divergence_features(
    action_seqs: Sequence[Sequence[str]],
    k: int,
    ended: Sequence[bool] | None = None,
    observations: Sequence[str] | None = None,
) -> dict[str, float]:
    """All divergence features of a group at step K.

    ``ended`` as in :func:`prefix_edit_distance`; ``observations`` (one per trajectory, the
    latest at step K) adds ``observation_unique_ratio``.
    """
    check_group(action_seqs)
    g = len(action_seqs)
    ends = [True] * g if ended is None else list(ended)
    prefixes = intern([padded_prefix(a, k, e) for a, e in zip(action_seqs, ends, strict=True)])
    at_k = [p[k - 1] if len(p) >= k else None for p in prefixes]
    features = {
        "prefix_edit_distance": mean_pairwise_distance(prefixes),
        "unique_prefix_ratio": len({tuple(p) for p in prefixes}) / g,
        "unique_action_ratio": len(set(at_k)) / g,
        "bigram_jaccard_distance": bigram_jaccard_distance(prefixes),
        "termination_frac": termination_frac(action_seqs, k, ends),
        "action_entropy": normalised_entropy(at_k),
    }
    if observations is not None:
        features["observation_unique_ratio"] = len(set(observations)) / g
    return features


__all__ = ["END", "bigram_jaccard_distance", "divergence_features", "normalised_entropy", "termination_frac"]
