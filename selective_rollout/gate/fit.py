"""Fit the ``learned`` gate's model (gate/learned.py) from logged rollouts.

    python -m selective_rollout.gate.fit --rollouts A.jsonl [B.jsonl ...] --k 4 [--steps 6,8]
        [--target 0.9] [--l2 1.0] [--cv-folds 5] --out gate.json

One row per labelled group (final rewards known) and decision step at which a run would ask
(K, then ``--steps``, while a trajectory is still running): the divergence features there and
the step, labelled by whether the group ended zero-variance. An L2-regularised logistic
regression on standardised features (numpy + scipy) gives P(zero variance). The stopping
threshold is chosen for ``--target`` precision of the gate as it runs (a group stops at the
first step where P >= threshold): the lowest threshold whose precision on the fit data reaches
the target. To keep that choice honest the probabilities it is chosen on are out-of-fold (each
task's groups scored by a model fit without that task, ``--cv-folds``), then the model is refit
on everything. When no threshold reaches the target the file says so and its gate never stops.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from selective_rollout.gate.learned import FEATURES, LearnedModel, decision_features
from selective_rollout.gate.replay import labelled, live_after, meets, state_at
from selective_rollout.records import GroupRecord, read_groups


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


def group_rows(
    groups: Sequence[GroupRecord], schedule: Sequence[int]
) -> list[tuple[GroupRecord, list[tuple[int, np.ndarray]]]]:
    """Per labelled group, its (step, feature vector) at each step of the schedule it lives past."""
    out = []
    for g in labelled(groups):
        steps = [s for s in schedule if live_after(g, s)]
        rows = []
        for s in steps:
            values = decision_features(state_at(g, s))
            rows.append((s, np.array([values[f] for f in FEATURES], dtype=float)))
        out.append((g, rows))
    return out


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Standardise ``x`` and minimise sum(log-loss) + l2/2 |w|^2 (the bias unpenalised).
    Returns (mean, scale, weights, bias); a constant feature gets scale 1 (and weight ~0)."""
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    z = (x - mean) / scale
    d = z.shape[1]

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:d], theta[d]
        logits = z @ w + b
        # sum log(1 + e^t) - y t, written to stay finite for large |t|
        value = float(np.sum(np.logaddexp(0.0, logits) - y * logits) + 0.5 * l2 * w @ w)
        p = 1.0 / (1.0 + np.exp(-logits))
        grad_w = z.T @ (p - y) + l2 * w
        grad_b = float(np.sum(p - y))
        return value, np.append(grad_w, grad_b)

    res = minimize(loss, np.zeros(d + 1), jac=True, method="L-BFGS-B")
    return mean, scale, res.x[:d], float(res.x[d])


def _probabilities(mean, scale, w, b, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(((x - mean) / scale) @ w + b)))


def choose_threshold(
    scored: Sequence[tuple[GroupRecord, list[tuple[int, float]]]], target: float
) -> tuple[float, dict[str, float]]:
    """The lowest threshold at which a gate stopping at the first step with P >= threshold keeps
    precision >= ``target`` on these groups (so it saves the most at that precision); 1.0 plus
    an epsilon (never stops) when none does. With its precision, recall and saving there."""
    candidates = sorted({p for _, steps in scored for _, p in steps}, reverse=True)
    total = sum(g.step_tokens for g, _ in scored) or 1
    zero = sum(bool(g.zero_variance) for g, _ in scored)
    best = (math.nextafter(1.0, 2.0), {"precision": math.nan, "recall": 0.0, "saved": 0.0})
    for thr in candidates:
        stops = tp = saved = 0
        for g, steps in scored:
            hit = next((s for s, p in steps if p >= thr), None)
            if hit is None:
                continue
            stops += 1
            tp += bool(g.zero_variance)
            saved += g.tokens_after(hit)
        precision = tp / stops if stops else math.nan
        if meets(precision, target) and saved / total > best[1]["saved"]:
            best = (
                thr,
                {"precision": precision, "recall": tp / zero if zero else math.nan, "saved": saved / total},
            )
    return best


def fit_model(
    groups: Sequence[GroupRecord],
    k: int,
    steps: Sequence[int] = (),
    target: float = 0.9,
    l2: float = 1.0,
    cv_folds: int = 5,
    seed: int = 0,
    sources: Sequence[str] = (),
) -> LearnedModel:
    """The learned gate's model fit on ``groups`` at schedule (k, steps) for ``target`` precision."""
    schedule = [k, *sorted(steps)]
    data = [(g, rows) for g, rows in group_rows(groups, schedule) if rows]
    if not data:
        raise ValueError(f"no labelled group is still running after step {k}: nothing to fit")
    labels = np.array([float(bool(g.zero_variance)) for g, _ in data])
    if labels.min() == labels.max():
        kind = "zero-variance" if labels[0] else "informative (mixed-reward)"
        raise ValueError(
            f"every one of the {len(data)} groups to fit is {kind}: a classifier needs both kinds"
        )

    def stack(part):
        x = np.array([v for _, rows in part for _, v in rows])
        y = np.array([float(bool(g.zero_variance)) for g, rows in part for _ in rows])
        return x, y

    x_all, y_all = stack(data)
    mean, scale, w, b = fit_logistic(x_all, y_all, l2)
    # out-of-fold probabilities for the threshold: each task scored by a model that never saw it
    tasks = [g.task_id for g, _ in data]
    folds = task_folds(tasks, cv_folds, seed, [bool(y) for y in labels]) if cv_folds >= 2 else None
    oof = folds is not None and len(set(folds)) >= 2
    scored: list[tuple[GroupRecord, list[tuple[int, float]]]] = [(g, []) for g, _ in data]
    if oof:
        for f in sorted(set(folds)):  # type: ignore[arg-type]
            train = [d for d, fi in zip(data, folds, strict=True) if fi != f]  # type: ignore[arg-type]
            x, y = stack(train)
            if y.min() == y.max():  # a fold with one class cannot be fit: fall back to in-sample
                oof = False
                break
            params = fit_logistic(x, y, l2)
            for i, ((_, rows), fi) in enumerate(zip(data, folds, strict=True)):  # type: ignore[arg-type]
                if fi == f:
                    probs = _probabilities(*params, np.array([v for _, v in rows]))
                    scored[i] = (data[i][0], [(s, float(p)) for (s, _), p in zip(rows, probs, strict=True)])
    if not oof:
        for i, (g, rows) in enumerate(data):
            probs = _probabilities(mean, scale, w, b, np.array([v for _, v in rows]))
            scored[i] = (g, [(s, float(p)) for (s, _), p in zip(rows, probs, strict=True)])
    threshold, at = choose_threshold(scored, target)
    info = {
        "sources": list(sources),
        "groups": len(data),
        "rows": len(y_all),
        "zero_variance": int(labels.sum()),
        "l2": l2,
        "threshold_on": f"out-of-fold ({cv_folds} folds by task)" if oof else "in-sample",
        "fit_precision": at["precision"],
        "fit_recall": at["recall"],
        "fit_saved": at["saved"],
        "reached_target": threshold <= 1.0,
    }
    return LearnedModel(
        features=list(FEATURES),
        mean=[float(v) for v in mean],
        scale=[float(v) for v in scale],
        weights=[float(v) for v in w],
        bias=b,
        threshold=float(threshold),
        k=k,
        steps=sorted(int(s) for s in steps),
        target_precision=target,
        info=info,
    )


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.gate.fit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rollouts", required=True, nargs="+", type=Path, help="rollouts.jsonl files")
    parser.add_argument("--out", required=True, type=Path, help="the model file to write (JSON)")
    parser.add_argument("--k", type=int, default=10, help="the gate's K (gate.k of the runs that use it)")
    parser.add_argument("--steps", type=_ints, default=[], help="later decision steps, e.g. 6,8 (gate.steps)")
    parser.add_argument("--target", type=float, default=0.9, help="precision the threshold is chosen for")
    parser.add_argument("--l2", type=float, default=1.0, help="L2 penalty on the standardised weights")
    parser.add_argument(
        "--cv-folds", type=int, default=5, help="folds (by task) for the threshold; <2: in-sample"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.k < 1 or any(s <= args.k for s in args.steps) or not 0 < args.target <= 1 or args.l2 < 0:
        print("error: need --k >= 1, --steps > k, 0 < --target <= 1 and --l2 >= 0", file=sys.stderr)
        return 2
    try:
        groups = [g for path in args.rollouts for g in read_groups(path)]
        model = fit_model(
            groups,
            args.k,
            args.steps,
            args.target,
            args.l2,
            args.cv_folds,
            args.seed,
            [str(p) for p in args.rollouts],
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    info = model.info
    where = f"k={model.k}" + (f" steps={model.steps}" if model.steps else "")
    print(
        f"fit on {info['groups']} groups ({info['zero_variance']} zero-variance), {info['rows']} rows,", where
    )
    for name, weight in sorted(zip(model.features, model.weights, strict=True), key=lambda t: -abs(t[1])):
        print(f"  {name:<26} {weight:+.3f}")
    if info["reached_target"]:
        print(
            f"threshold P >= {model.threshold:.3f} for precision {args.target} ({info['threshold_on']}): "
            f"precision {info['fit_precision']:.2f}, recall {info['fit_recall']:.2f}, "
            f"saves {info['fit_saved']:.1%}"
        )
    else:
        print(f"no threshold reached precision {args.target} on the fit data: this gate never stops")
    keys = f"gate.k={model.k}" + (f" gate.steps=[{','.join(map(str, model.steps))}]" if model.steps else "")
    print(f"wrote {args.out}; use it with gate.name=learned gate.model_path={args.out} {keys}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
