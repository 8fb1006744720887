"""How precisely a learning experiment measured its held-out change, and how many seeds, tries or
tasks a CI that excludes 0 would take (base layer, numpy only; the experiment runner prints it).

The pooled change (after - before per seed and held-out task, averaged over both) varies for
three reasons, each estimated from the experiment's own runs:

- **tasks**: the true change differs from task to task (``between_tasks``); only more tasks
  average it out;
- **sampling**: a task's success rate over ``tries`` sampled episodes is a binomial draw, before
  and after (``sampling``: the per-episode variance of a try's after - before); more tries or
  more seeds average it out. With the tries' outcomes recorded (``try_changes``) it is measured
  from their paired differences, so whatever the shared sampling seeds cancel is counted;
  without, it is the two evaluations' p(1 - p) summed, which assumes they cancel nothing;
- **seed**: runs on different seeds train to different weights (their task order and rollout
  sampling differ too); ``training`` is the spread of a task's change across seeds that sampling
  does not explain; only more seeds average it out.

With S seeds, T tries and N tasks the pooled mean's variance is then
``(between_tasks + (sampling / T + training) / S) / N``. At the experiment's own design this is
the standard error that resampling tasks (the runner's CI) measures, so agreeing with it checks
nothing; what the split adds is the projection to other designs.

Without per-try outcomes the split treats a seed's before and after evaluations as independent.
They share per-step sampling seeds (``seed:-1:task:try:step``), which make them covary if the
policy moved little; ``covariance`` measures it (the mean over tasks of before and after's
covariance across seeds). Were it positive, ``sampling`` would be overstated and ``training``
understated by 2 x covariance / T, and the projection to more tries optimistic by
covariance / T; the projections over seeds and tasks rest on the measured spread and are
unaffected.

The fit is by moments and floored at 0. With two dozen tasks its between-task part is itself
uncertain, so the seeds it projects are an order of magnitude, not a count to plan to the seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Z95 = NormalDist().inv_cdf(0.975)  # two-sided 95%
MAX_SEEDS = 200  # beyond this a design is not one anybody would run: the report says "none"

PerTask = Mapping[str, float]


@dataclass(frozen=True)
class ChangePrecision:
    """The variance components of one arm's pooled held-out change at the design it ran."""

    mean: float
    seeds: int
    tries: int
    tasks: int
    between_tasks: float
    sampling: float
    training: float
    covariance: float = 0.0

    def half_width(self, seeds: int, tries: int, tasks: int) -> float:
        """The 95% half-width of the pooled change the model predicts at another design."""
        return Z95 * self.standard_error(seeds, tries, tasks)

    def standard_error(self, seeds: int, tries: int, tasks: int) -> float:
        per_seed = self.sampling / tries + self.training
        return math.sqrt((self.between_tasks + per_seed / seeds) / tasks)

    def seeds_needed(
        self, tries: int | None = None, tasks: int | None = None, odds: float = 0.5
    ) -> int | None:
        """The fewest seeds at ``tries`` and ``tasks`` (the experiment's own by default) whose 95%
        CI would exclude 0 with probability ``odds`` if the measured change were the true one:
        at even odds (0.5) the CI's half-width is the change, at 0.8 the change also clears
        0.84 standard errors of bad luck. None when no number up to ``MAX_SEEDS`` would (a
        change of 0, or the tasks' own spread alone too wide)."""
        tries, tasks = tries or self.tries, tasks or self.tasks
        z = Z95 + NormalDist().inv_cdf(odds)
        for seeds in range(1, MAX_SEEDS + 1):
            if z * self.standard_error(seeds, tries, tasks) < abs(self.mean):
                return seeds
        return None


def change_precision(
    per_seed: Mapping[int, tuple[PerTask, PerTask]],
    tries: int,
    try_changes: Mapping[int, Mapping[str, Sequence[float]]] | None = None,
) -> ChangePrecision | None:
    """Fit the components from ``seed -> (before, after)`` per-task success rates, each a mean
    over ``tries`` episodes, on the tasks every seed scored before and after; ``try_changes``
    (``seed -> task -> after - before per try``, ``policy_eval.per_try_changes``), when it covers
    those tasks on every seed, measures the sampling term. None with fewer than 2 seeds (no
    spread across seeds to split), 2 tasks or 2 tries."""
    if tries < 2 or len(per_seed) < 2:
        return None
    pairs = list(per_seed.values())
    tasks = sorted(set.intersection(*(set(b) & set(a) for b, a in pairs)))
    if len(tasks) < 2:
        return None
    before = np.array([[b[t] for t in tasks] for b, _ in pairs])
    after = np.array([[a[t] for t in tasks] for _, a in pairs])
    change = after - before
    seeds = len(pairs)

    def episode_variance(rate: np.ndarray) -> np.ndarray:  # unbiased p(1-p) from `tries` draws
        return rate * (1 - rate) * tries / (tries - 1)

    within = float(change.var(axis=0, ddof=1).mean())  # a task's change, seed to seed
    sampling = float((episode_variance(before) + episode_variance(after)).mean())
    if try_changes is not None and all(t in try_changes.get(s, {}) for s in per_seed for t in tasks):
        # a try's change, try to try within its seed and task: the same binomial noise, with
        # whatever the two evaluations' shared seeds pair already taken out
        sampling = float(np.mean([np.var(try_changes[s][t], ddof=1) for s in per_seed for t in tasks]))
    deviations = (before - before.mean(axis=0)) * (after - after.mean(axis=0))
    return ChangePrecision(
        mean=float(change.mean()),
        seeds=seeds,
        tries=tries,
        tasks=len(tasks),
        between_tasks=max(0.0, float(change.mean(axis=0).var(ddof=1)) - within / seeds),
        sampling=sampling,
        training=max(0.0, within - sampling / tries),
        covariance=float(deviations.sum(axis=0).mean() / (seeds - 1)),
    )


def paired_seeds_needed(differences: Sequence[float], effect: float, odds: float = 0.5) -> int | None:
    """The fewest seeds whose 95% CI of a mean paired difference (arm minus reference on the same
    seed, one per seed) would exclude 0 with probability ``odds`` if the true difference were
    ``effect``, at the spread the measured ``differences`` show from seed to seed; at least 2 (one
    seed has no spread to put a CI on). None with fewer than 2 differences (no spread measured), a
    zero ``effect``, or more than ``MAX_SEEDS`` needed. A normal approximation: with a handful of
    seeds the spread itself is uncertain, so the count is an order of magnitude."""
    if len(differences) < 2 or effect == 0:
        return None
    spread = float(np.std(differences, ddof=1))
    z = Z95 + NormalDist().inv_cdf(odds)
    seeds = max(2, math.ceil((z * spread / abs(effect)) ** 2))
    return seeds if seeds <= MAX_SEEDS else None
