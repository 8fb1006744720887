"""Prefix edit distance between action sequences (the paper's D_K), C library and reference.

Whole actions are the tokens of the distance. Actions are interned to small integers before
they reach the C library (``editdistance``), which compares hashable items: integers cannot
collide, strings' hashes could in principle. A plain-Python Levenshtein is kept as the
reference the tests hold the C path to, and as the fallback the benchmark compares against.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import combinations

import editdistance

END = "<END>"

Levenshtein = Callable[[Sequence[Hashable], Sequence[Hashable]], int]


def levenshtein_py(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Levenshtein distance by the textbook two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        cur = [i]
        for j, y in enumerate(b, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def levenshtein_c(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    return int(editdistance.eval(a, b))


def normalised(dist: int, len_a: int, len_b: int) -> float:
    """Levenshtein / max(len); 0 when both are empty."""
    longest = max(len_a, len_b)
    return dist / longest if longest else 0.0


def padded_prefix(actions: Sequence[str], k: int, ended: bool = True) -> list[str]:
    """The first ``k`` actions; an ended trajectory shorter than ``k`` is padded with END."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    prefix = list(actions[:k])
    if ended and len(prefix) < k:
        prefix.extend([END] * (k - len(prefix)))
    return prefix


def intern(seqs: Sequence[Sequence[str]]) -> list[list[int]]:
    """Map each distinct action to a small integer, shared across the group."""
    ids: dict[str, int] = {}
    return [[ids.setdefault(a, len(ids)) for a in seq] for seq in seqs]


def check_group(action_seqs: Sequence[Sequence[str]]) -> None:
    if len(action_seqs) < 2:
        raise ValueError(f"a group needs G >= 2 trajectories, got {len(action_seqs)}")
    for i, seq in enumerate(action_seqs):
        if isinstance(seq, str):
            raise TypeError(f"trajectory {i}: expected a sequence of action strings, got one string")


def mean_pairwise_distance(seqs: Sequence[Sequence[Hashable]], lev: Levenshtein = levenshtein_c) -> float:
    """Mean normalised Levenshtein distance over all G(G-1)/2 pairs."""
    pairs = list(combinations(seqs, 2))
    total = sum(normalised(lev(a, b), len(a), len(b)) for a, b in pairs)
    return total / len(pairs)


def prefix_edit_distance(
    action_seqs: Sequence[Sequence[str]],
    k: int,
    ended: Sequence[bool] | None = None,
    lev: Levenshtein = levenshtein_c,
) -> float:
    """D_K: mean pairwise normalised edit distance of the groups' first K actions.

    ``ended[i]`` says whether trajectory i is over; an ended one shorter than K is padded with
    END. By default every trajectory shorter than K counts as ended (offline logs hold whole
    trajectories). A live trajectory shorter than K is compared as it stands.
    """
    check_group(action_seqs)
    ends = [True] * len(action_seqs) if ended is None else list(ended)
    prefixes = [padded_prefix(a, k, e) for a, e in zip(action_seqs, ends, strict=True)]
    return mean_pairwise_distance(intern(prefixes), lev)
