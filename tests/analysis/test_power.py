"""The held-out change's variance components (analysis.power): recovered from simulated
experiments whose components are known, and the seeds a design needs."""

from __future__ import annotations

import numpy as np
import pytest

from selective_rollout.analysis.power import Z95, ChangePrecision, change_precision, paired_seeds_needed


def _simulated(seeds: int, tasks: int, tries: int, between: float, training: float, rng) -> dict:
    """seed -> (before, after) per-task success rates over ``tries`` binomial episodes: task t
    starts at p_t, truly changes by d_t (spread ``between``), and a seed's training moves it by
    a further draw of variance ``training``."""
    start = rng.uniform(0.2, 0.8, tasks)
    true_change = rng.normal(0.05, np.sqrt(between), tasks)
    out = {}
    for s in range(seeds):
        after_p = np.clip(start + true_change + rng.normal(0, np.sqrt(training), tasks), 0, 1)
        before = rng.binomial(tries, start) / tries
        after = rng.binomial(tries, after_p) / tries
        out[s] = ({f"t{i}": b for i, b in enumerate(before)}, {f"t{i}": a for i, a in enumerate(after)})
    return out


def test_the_components_of_a_simulated_experiment_are_recovered():
    rng = np.random.default_rng(0)
    fit = change_precision(_simulated(40, 400, 4, between=0.01, training=0.02, rng=rng), tries=4)
    assert fit is not None and (fit.seeds, fit.tries, fit.tasks) == (40, 4, 400)
    assert fit.between_tasks == pytest.approx(0.01, rel=0.3)
    assert fit.training == pytest.approx(0.02, rel=0.3)
    # two binomial evaluations of rates between 0.2 and 0.8: p(1-p) in 0.16..0.25 each
    assert 0.35 < fit.sampling < 0.5
    assert fit.mean == pytest.approx(0.05, abs=0.02)


def test_a_fit_at_one_design_predicts_the_spread_at_another():
    # fitted on experiments of 4 seeds x 4 tries (24 tasks), the model's half-width for 12 seeds
    # x 8 tries is 1.96 standard deviations of the pooled changes of experiments of that design
    rng = np.random.default_rng(1)
    fits = [change_precision(_simulated(4, 24, 4, 0.01, 0.02, rng), 4) for _ in range(100)]
    means = []
    for _ in range(300):
        runs = _simulated(12, 24, 8, 0.01, 0.02, rng)
        means.append(np.mean([a[t] - b[t] for b, a in runs.values() for t in b]))
    predicted = np.median([f.half_width(12, 8, 24) for f in fits])
    assert predicted == pytest.approx(Z95 * np.std(means), rel=0.25)


def test_before_and_after_covary_when_they_share_their_draws():
    rng = np.random.default_rng(3)
    independent = change_precision(_simulated(8, 200, 4, 0.01, 0.0, rng), 4)
    assert abs(independent.covariance) < 0.005
    # the policy did not move and the evaluations drew the same episodes: after = before
    runs = _simulated(8, 200, 4, 0.01, 0.0, rng)
    same = change_precision({s: (b, b) for s, (b, _) in runs.items()}, 4)
    spread = np.mean([np.var([runs[s][0][t] for s in runs], ddof=1) for t in runs[0][0]])
    assert same.covariance == pytest.approx(spread) and same.covariance > 0.02
    assert same.mean == 0.0 and same.training == 0.0


def test_more_seeds_tries_and_tasks_narrow_the_ci_down_to_the_tasks_own_spread():
    fit = ChangePrecision(
        mean=0.06, seeds=4, tries=4, tasks=24, between_tasks=0.01, sampling=0.24, training=0.02
    )
    assert fit.half_width(4, 4, 24) == pytest.approx(Z95 * np.sqrt((0.01 + (0.06 + 0.02) / 4) / 24))
    assert fit.half_width(8, 4, 24) < fit.half_width(4, 4, 24)
    assert fit.half_width(4, 8, 24) < fit.half_width(4, 4, 24)
    assert fit.half_width(4, 4, 48) < fit.half_width(4, 4, 24)
    needed = fit.seeds_needed()
    assert needed is not None
    assert fit.half_width(needed, 4, 24) < 0.06 <= fit.half_width(needed - 1, 4, 24)
    # 80% odds: the half-width plus 0.84 standard errors of bad luck must fit under the change
    likely = fit.seeds_needed(odds=0.8)
    assert likely is not None and likely > needed
    assert (Z95 + 0.8416) * fit.standard_error(likely, 4, 24) < 0.06
    assert fit.seeds_needed(tries=8) <= needed and fit.seeds_needed(tasks=48) < needed
    # the tasks' own spread alone is wider than the change: no number of seeds on 24 tasks
    floor = Z95 * np.sqrt(0.01 / 24)
    narrow = ChangePrecision(0.9 * floor, 4, 4, 24, 0.01, 0.24, 0.02)
    assert narrow.seeds_needed() is None and narrow.seeds_needed(tasks=96) is not None
    assert ChangePrecision(0.0, 4, 4, 24, 0.01, 0.24, 0.02).seeds_needed() is None
    # a loss is measured the same way as a gain
    assert ChangePrecision(-0.06, 4, 4, 24, 0.01, 0.24, 0.02).seeds_needed() == needed


def test_too_little_data_has_no_fit():
    one = {0: ({"a": 0.5, "b": 0.25}, {"a": 0.75, "b": 0.5})}
    assert change_precision(one, tries=4) is None  # one seed: no spread across seeds
    two = {**one, 1: ({"a": 0.25, "c": 0.5}, {"a": 0.5, "c": 0.5})}
    assert change_precision(two, tries=4) is None  # one task both seeds scored
    assert change_precision({**one, 1: one[0]}, tries=1) is None  # one try: no binomial spread
    fit = change_precision({**one, 1: one[0]}, tries=4)
    assert fit is not None and fit.training == 0.0 and fit.between_tasks == 0.0  # floored, not negative


def test_paired_tries_measure_the_sampling_the_shared_draws_cancel():
    rng = np.random.default_rng(5)
    runs = _simulated(6, 100, 4, 0.01, 0.01, rng)
    unpaired = change_precision(runs, 4)
    # every try of every task repeated its outcome: the paired tries carry no sampling noise
    changes = {s: {t: [0, 0, 0, 0] for t in b} for s, (b, _) in runs.items()}
    assert change_precision(runs, 4, changes).sampling == 0.0
    changes[0]["t0"] = [1, 0, 0, -1]  # one task of one seed flipped two tries
    paired = change_precision(runs, 4, changes)
    assert paired.sampling == pytest.approx(np.var([1, 0, 0, -1], ddof=1) / (6 * 100))
    assert paired.training > unpaired.training  # what sampling no longer explains is the seeds'
    # try changes missing for a task of some seed: the binomial estimate, not a partial one
    del changes[3]["t5"]
    assert change_precision(runs, 4, changes).sampling == unpaired.sampling


def test_seeds_for_a_paired_difference_follow_the_spread_and_the_effect():
    diffs = [-10.0, -30.0, -20.0, 0.0, -40.0]  # SD 15.8 over seeds
    at_measured = paired_seeds_needed(diffs, -20.0)
    # (1.96 x 15.8 / 20)^2 = 2.4 -> 3 seeds at even odds; 80% odds asks (2.80 x 15.8 / 20)^2 -> 5
    assert at_measured == 3 and paired_seeds_needed(diffs, -20.0, 0.8) == 5
    assert paired_seeds_needed(diffs, -10.0) == 10  # half the effect: four times the seeds
    assert paired_seeds_needed(diffs, 20.0) == at_measured  # the sign does not matter
    assert paired_seeds_needed([-20.0, -20.0], -20.0) == 2  # no spread: a CI still needs 2 seeds


def test_no_seed_count_without_a_spread_or_an_effect():
    assert paired_seeds_needed([-20.0], -20.0) is None  # one seed: no spread measured
    assert paired_seeds_needed([-10.0, 10.0], 0.0) is None
    assert paired_seeds_needed([-100.0, 100.0], -1.0) is None  # beyond MAX_SEEDS
