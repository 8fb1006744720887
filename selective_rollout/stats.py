"""Small statistics shared across layers (the base layer): the exact binomial interval of a precision,
bootstrap intervals, paired tests, folds by task, and the GRPO advantage formula (one definition
for the trainer and the offline gate evaluation)."""

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


def sign_flip_p(diffs: Sequence[float], resamples: int = 20000, seed: int = 0) -> float:
    """Two-sided p-value of a paired change: under "no change" each unit's after - before is as
    likely to have either sign, so the mean is compared with the means of every sign flip (exact
    up to 2**14 flips, Monte Carlo beyond). On 0/1 outcomes this is the exact sign test (McNemar's
    exact test): units that did not change carry no evidence either way, as they should."""
    data = np.asarray(diffs, dtype=float)
    if data.size < 2 or not np.any(data):  # one unit's two signs are equally extreme
        return 1.0
    from scipy.stats import permutation_test

    result = permutation_test(
        (data,),
        np.mean,
        permutation_type="samples",
        n_resamples=resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(min(1.0, result.pvalue))


def newcombe_paired_ci(
    both: int, before_only: int, after_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval (his method 10) of ``p_after - p_before`` for paired 0/1
    outcomes. Right at a handful of pairs, unlike a bootstrap over them: with one pair flipped out
    of eight the bootstrap reads [-37.5%, 0%], an interval that can never show a gain, while the
    score interval keeps the gain the data cannot rule out."""
    n = both + before_only + after_only + neither
    if n <= 0:
        return (float("nan"), float("nan"))
    from scipy.stats import binomtest

    def wilson(hits: int) -> tuple[float, float, float]:
        ci = binomtest(hits, n).proportion_ci(confidence, method="wilson")
        return hits / n, float(ci.low), float(ci.high)

    p_after, lo_after, hi_after = wilson(both + after_only)
    p_before, lo_before, hi_before = wilson(both + before_only)
    margins = (both + after_only) * (before_only + neither) * (both + before_only) * (after_only + neither)
    # the correlation of the pair, with the continuity correction of Altman's "Statistics with
    # confidence": a small positive association is taken as none
    cross = both * neither - after_only * before_only
    cross = cross - n / 2 if cross > n / 2 else min(cross, 0)
    phi = cross / np.sqrt(margins) if margins else 0.0
    down = np.sqrt(
        (p_after - lo_after) ** 2
        - 2 * phi * (p_after - lo_after) * (hi_before - p_before)
        + (hi_before - p_before) ** 2
    )
    up = np.sqrt(
        (hi_after - p_after) ** 2
        - 2 * phi * (hi_after - p_after) * (p_before - lo_before)
        + (p_before - lo_before) ** 2
    )
    diff = p_after - p_before
    return (float(max(-1.0, diff - down)), float(min(1.0, diff + up)))


def task_folds(
    task_ids: Sequence[str], folds: int, seed: int = 0, labels: Sequence[bool] | None = None
) -> list[int]:
    """A fold index per item such that items of one task share a fold: the tasks, shuffled by
    ``seed``, dealt round-robin into ``folds`` folds. With ``labels`` (one per item: zero
    variance?) the folds are stratified: tasks are dealt in order of their share of
    zero-variance groups, so that each fold gets its part of both kinds (on a small log an
    unlucky split can otherwise leave a fit part with one kind only)."""
    tasks = sorted(set(task_ids))
    order = [tasks[i] for i in np.random.default_rng(seed).permutation(len(tasks))]
    if labels is not None:
        share: dict[str, list[bool]] = {}
        for t, y in zip(task_ids, labels, strict=True):
            share.setdefault(t, []).append(bool(y))
        order.sort(key=lambda t: sum(share[t]) / len(share[t]))  # stable: shuffled within a stratum
    fold_of = {t: n % folds for n, t in enumerate(order)}
    return [fold_of[t] for t in task_ids]
