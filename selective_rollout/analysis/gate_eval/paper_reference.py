"""The paper's per-K operating points: the reference line of the held-out evaluation.

arXiv 2605.05802 stops a group of G = 8 ALFWorld rollouts, capped at T = 30 steps, when the prefix
edit distance of its first K actions is small (D_K < tau). For each decision step K it reports the
best such rule at precision >= 0.8 over 100 groups: the share of step-tokens it saves, its precision,
and its recall of the zero-variance groups. At K = 5-8 no rule reaches precision 0.8, so nothing is
saved there; the best is K = 11-12 (K/T about 0.37-0.4), 15.2% saved at precision 0.80-0.86.

A gate evaluated here decides at its own K under its own cap T, and how much a cut at K saves
depends on how much of the episode is left after it, so the two are compared at the same fraction
of the horizon, K/T, not at the same K.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

ARXIV = "2605.05802"
HORIZON = 30  # the paper's episode cap T


@dataclass(frozen=True)
class PaperPoint:
    """The paper's best rule at decision step ``k`` of ``HORIZON``; ``precision`` and ``recall`` are
    None where no rule reached precision 0.8 (``saved`` is 0 there)."""

    k: int
    saved: float  # share of step-tokens
    precision: float | None
    recall: float | None

    @property
    def k_over_t(self) -> float:
        return self.k / HORIZON

    def __str__(self) -> str:
        at = (
            "none at precision >= 0.8"
            if self.precision is None
            else f"{self.saved:.1%} at {self.precision:.2f}"
        )
        return f"K={self.k}/{HORIZON} ({self.k_over_t:.2f}): {at}"


POINTS: tuple[PaperPoint, ...] = (
    *(PaperPoint(k, 0.0, None, None) for k in range(5, 9)),
    PaperPoint(9, 0.126, 0.82, 0.46),
    PaperPoint(10, 0.133, 0.80, 0.51),
    PaperPoint(11, 0.152, 0.80, 0.62),
    PaperPoint(12, 0.150, 0.86, 0.64),
    PaperPoint(13, 0.147, 0.84, 0.67),
    PaperPoint(14, 0.139, 0.84, 0.67),
    PaperPoint(15, 0.125, 0.83, 0.64),
    PaperPoint(20, 0.067, 0.83, 0.51),
    PaperPoint(25, 0.028, 0.89, 0.44),
)


def nearest(k: int, horizon: int) -> PaperPoint:
    """The paper's point whose K/T is nearest to ``k / horizon`` (not interpolated: between the
    reported steps the paper's rule is unknown). Ties go to the earlier step; a K/T outside the
    reported 5/30..25/30 gets the end point. Compared exactly, so a tie is a tie."""
    at = Fraction(k, horizon)
    return min(POINTS, key=lambda p: (abs(Fraction(p.k, HORIZON) - at), p.k))


def reference_table() -> list[str]:
    """The points as a markdown table, one column per K, with its K/T."""

    def row(name: str, cells: list[str]) -> str:
        return f"| {name} | " + " | ".join(cells) + " |"

    def fraction(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    return [
        row("K", [str(p.k) for p in POINTS]),
        "|" + "---|" * (len(POINTS) + 1),
        row("K/T", [f"{p.k_over_t:.2f}" for p in POINTS]),
        row("saved (share of step-tokens)", [f"{p.saved:.1%}" for p in POINTS]),
        row("precision", [fraction(p.precision) for p in POINTS]),
        row("recall (of zero-variance groups)", [fraction(p.recall) for p in POINTS]),
    ]
