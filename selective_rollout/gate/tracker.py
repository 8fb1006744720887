"""Incremental pairwise prefix edit distance for a live group.

The coordinator appends one action per trajectory per step; recomputing all G(G-1)/2
Levenshtein tables from scratch at every step would cost O(G^2 K^2) per step. Instead each
pair keeps its full dynamic-programming table over prefixes, so appending to trajectory i
adds one row (or column) to the G-1 tables it takes part in: O(G K) per action. Any prefix
length s can then be read off as table[s][s], so D_s for every s <= current length is O(G^2).
Results equal :func:`prefix_edit_distance` exactly (integer tables, same normalisation).
"""

from __future__ import annotations

from itertools import combinations

from selective_rollout.gate.distance import END, normalised


class _PairTable:
    """DP table D[p][q] = Levenshtein(a[:p], b[:q]) grown one row or column at a time."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[list[int]] = [[0]]

    def add_to_a(self, x: int, b: list[int]) -> None:
        prev = self.rows[-1]
        cur = [prev[0] + 1]
        for q, y in enumerate(b, start=1):
            cur.append(min(prev[q] + 1, cur[q - 1] + 1, prev[q - 1] + (x != y)))
        self.rows.append(cur)

    def add_to_b(self, y: int, a: list[int]) -> None:
        rows = self.rows
        rows[0].append(rows[0][-1] + 1)
        for p, x in enumerate(a, start=1):
            row, above = rows[p], rows[p - 1]
            row.append(min(above[-1] + 1, row[-1] + 1, above[-2] + (x != y)))

    def at(self, s: int) -> int:
        return self.rows[s][s]


class DivergenceTracker:
    """Pairwise prefix distances of G trajectories, updated as actions arrive."""

    def __init__(self, g: int) -> None:
        if g < 2:
            raise ValueError(f"a group needs G >= 2 trajectories, got {g}")
        self.g = g
        self._ids: dict[str, int] = {}
        self._seqs: list[list[int]] = [[] for _ in range(g)]
        self._ended = [False] * g
        self._pairs = {pair: _PairTable() for pair in combinations(range(g), 2)}

    def _append_id(self, i: int, token: int) -> None:
        for j in range(self.g):
            if j < i:
                self._pairs[(j, i)].add_to_b(token, self._seqs[j])
            elif j > i:
                self._pairs[(i, j)].add_to_a(token, self._seqs[j])
        self._seqs[i].append(token)

    def append(self, i: int, action: str) -> None:
        """Record trajectory i's next action."""
        if self._ended[i]:
            raise ValueError(f"trajectory {i} has ended; it takes no more actions")
        self._append_id(i, self._ids.setdefault(action, len(self._ids)))

    def end(self, i: int) -> None:
        """Mark trajectory i as over: from now on it is padded with END."""
        self._ended[i] = True

    def length(self, i: int) -> int:
        return len(self._seqs[i])

    def distance(self, k: int) -> float:
        """D_k over the first k actions of every trajectory (ended ones END-padded)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        end_id = self._ids.setdefault(END, len(self._ids))
        for i in range(self.g):
            if self._ended[i]:
                while len(self._seqs[i]) < k:
                    self._append_id(i, end_id)
            elif len(self._seqs[i]) < k:
                raise ValueError(f"trajectory {i} is live with {len(self._seqs[i])} < k={k} actions")
        total = sum(normalised(t.at(k), k, k) for t in self._pairs.values())
        return total / len(self._pairs)
