"""Small statistics shared across floors (floor 1): the exact binomial interval of a precision,
bootstrap intervals, and the GRPO advantage formula (one definition for the trainer and the
offline gate evaluation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1 << 16)  # pure, and asked again and again for the same counts (audits, replays)
def clopper_pearson(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) two-sided interval of a binomial proportion ``hits / n``.

    Exact rather than Wald or Wilson because audits are few (a handful per run) and precision
    sits near 1, where the normal approximations claim more certainty than the data holds.
    """
    if n <= 0 or not 0 <= hits <= n:
        raise ValueError(f"need 0 <= hits <= n and n > 0, got hits={hits}, n={n}")
    from scipy.stats import beta

    alpha = 1.0 - confidence
    low = 0.0 if hits == 0 else float(beta.ppf(alpha / 2, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta.ppf(1 - alpha / 2, hits + 1, n - hits))
    return low, high


def grpo_advantages(rewards: Sequence[float] | np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO's group-relative advantage ``(r - mean) / (std + eps)`` with the sample (n-1) std, as
    torch.std and OpenRLHF use. A group of one has no spread to learn from: its advantage is 0.

    The trainer's ``grpo`` estimator and the offline gate evaluation's "advantage L2 preserved"
    both call this, so the figure offline is the signal the learner would get."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2:
        return np.zeros_like(r)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def bootstrap_ci(values: Sequence[float], resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% CI of the mean, resampling tasks (not episodes, which share a task)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return (float("nan"), float("nan"))
    if np.all(data == data[0]):
        return (float(data[0]), float(data[0]))
    rng = np.random.default_rng(seed)
    means = rng.choice(data, size=(resamples, data.size), replace=True).mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return (float(lo), float(hi))


def cluster_bootstrap_ci(
    clusters: Sequence[np.ndarray],
    statistic: Callable[[np.ndarray], float],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile CI of ``statistic`` over rows, resampling whole clusters with replacement.

    ``clusters[i]`` is a 2-D array of the rows of cluster i (e.g. the groups of one task: groups
    of a task share its difficulty, so they are resampled together); ``statistic`` maps the
    stacked rows of a resample to a number (a ratio of sums such as a precision). Resamples where
    the statistic is undefined (NaN, e.g. no cut at all) are left out; NaN when all are."""
    if not clusters:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    n = len(clusters)
    values = []
    for _ in range(resamples):
        pick = rng.integers(0, n, size=n)
        value = statistic(np.concatenate([clusters[i] for i in pick], axis=0))
        if not np.isnan(value):
            values.append(value)
    if not values:
        return (float("nan"), float("nan"))
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return (float(lo), float(hi))
