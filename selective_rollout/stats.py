"""Small statistics shared across floors: the exact binomial interval of a precision (floor 1)."""

from __future__ import annotations


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
