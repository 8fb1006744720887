"""The ``learned`` gate: a logistic model of P(zero variance) over the divergence features at the
decision step (and the step itself), fit offline from logged rollouts.

    python -m selective_rollout.analysis.gate_eval.fit --rollouts A.jsonl [B.jsonl ...] --k 4 --out gate.json
    python -m selective_rollout.train ... gate.name=learned gate.k=4 gate.model_path=gate.json

The model file (JSON, written by ``fit_model``) holds the feature names, their standardisation
(means, scales), the weights and bias, the probability threshold chosen on the fit data for a
target precision, and the schedule (K and later steps) it was fit at; the gate refuses a file
fit at another schedule, since its threshold was chosen for that one. The gate stops a group
when the predicted P(zero variance) >= the threshold (``p_stop`` overrides the file's).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, PrivateAttr, model_validator

from selective_rollout.gate.base import Calibration, Gate, GateDecision, GateParams, GroupView
from selective_rollout.gate.calibration import meets
from selective_rollout.gate.features import divergence_features
from selective_rollout.gate.snapshot import labelled, live_after, state_at
from selective_rollout.records import GroupRecord
from selective_rollout.stats import task_folds

FORMAT = "selective-rollout/learned-gate"
VERSION = 1

# what the gate can compute online at any decision step (observation_unique_ratio needs the
# observations, which a GroupView does not carry); "step" is the decision step itself
FEATURES = (
    "prefix_edit_distance",
    "unique_prefix_ratio",
    "unique_action_ratio",
    "bigram_jaccard_distance",
    "termination_frac",
    "action_entropy",
    "step",
)


def decision_features(group: GroupView) -> dict[str, float]:
    """The learned gate's inputs: every divergence feature at the group's step, and the step."""
    return {**divergence_features(group.actions, group.step, group.ended), "step": float(group.step)}


@dataclass
class LearnedModel:
    """A fitted logistic model and its operating point, as stored in the model file."""

    features: list[str]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    threshold: float  # stop when P(zero variance) >= this
    k: int
    steps: list[int] = field(default_factory=list)
    target_precision: float = 0.9
    info: dict[str, Any] = field(default_factory=dict)  # how it was fit (files, sizes, fit precision)

    def probability(self, values: dict[str, float]) -> float:
        z = self.bias + sum(
            w * (values[f] - m) / s
            for f, m, s, w in zip(self.features, self.mean, self.scale, self.weights, strict=True)
        )
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, indent=2) + "\n"
        )

    @classmethod
    def load(cls, path: str | Path) -> LearnedModel:
        """Read a model file, with one clear error for a missing, foreign or damaged one."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(
                f"learned gate model file not found: {path} "
                "(write one with python -m selective_rollout.analysis.gate_eval.fit)"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"learned gate model file {path} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a learned gate model (no format {FORMAT!r})")
        if data.get("version") != VERSION:
            raise ValueError(
                f"{path}: learned gate model version {data.get('version')!r}, this reader: {VERSION}"
            )
        try:
            model = cls(**{k: v for k, v in data.items() if k not in ("format", "version")})
        except TypeError as exc:
            raise ValueError(f"{path}: not a valid learned gate model: {exc}") from None
        n = len(model.features)
        if not n or any(len(v) != n for v in (model.mean, model.scale, model.weights)):
            raise ValueError(f"{path}: features, mean, scale and weights must have one length")
        unknown = sorted(set(model.features) - set(FEATURES))
        if unknown:
            raise ValueError(f"{path}: unknown features {unknown}; the gate computes {list(FEATURES)}")
        if any(s <= 0 for s in model.scale):
            raise ValueError(f"{path}: every scale must be > 0")
        return model


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

    from scipy.optimize import minimize  # only where a model is fit, not where the gate runs

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


class LearnedParams(GateParams):
    model_path: str | None = Field(
        None,
        description="the model file written by python -m selective_rollout.analysis.gate_eval.fit (required)",
    )

    p_stop: float | None = Field(
        None, ge=0.0, le=1.0, description="stop when P(zero variance) >= this; unset: the file's threshold"
    )

    _model: LearnedModel | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _model_fits_the_schedule(self) -> LearnedParams:
        """The model file is read once, here, so that a missing, damaged or differently fit file is
        one config error at load; the gate uses the model read (``model``)."""
        if self.model_path is None:
            raise ValueError(
                "gate 'learned' needs model_path, the file "
                "python -m selective_rollout.analysis.gate_eval.fit writes"
            )
        model = LearnedModel.load(self.model_path)
        schedule, fitted = [self.k, *self.steps], [model.k, *model.steps]
        if self.mode != "at_k" or schedule != fitted:
            raise ValueError(
                f"the learned gate model {self.model_path} was fit at k={model.k} "
                f"steps={model.steps} (mode at_k), its threshold is for that schedule; set "
                f"gate.k={model.k} gate.steps={model.steps} (this gate: k={self.k} "
                f"steps={self.steps} mode={self.mode})"
            )
        self._model = model
        return self

    @property
    def model(self) -> LearnedModel:
        assert self._model is not None  # set by the validator
        return self._model


class LearnedGate(Gate):
    """A logistic model of P(zero variance) over the divergence features at the decision step (and
    the step), fit offline by ``python -m selective_rollout.analysis.gate_eval.fit``; stops when P >= its
    threshold."""

    Params = LearnedParams
    threshold = "p_stop"
    params: LearnedParams

    def __init__(self, params: GateParams | None = None, **values: Any) -> None:
        super().__init__(params, **values)
        self.model = self.params.model

    @property
    def p_stop(self) -> float:
        return self.model.threshold if self.params.p_stop is None else self.params.p_stop

    def decide(self, group: GroupView) -> GateDecision:
        values = decision_features(group)
        p = self.model.probability(values)
        stop = p >= self.p_stop
        op = ">=" if stop else "<"
        features = {"p_zero_variance": p, "prefix_edit_distance": values["prefix_edit_distance"]}
        return GateDecision(
            stop, f"P(zero variance | step {group.step})={p:.3f} {op} {self.p_stop:.3f}", features
        )

    @classmethod
    def calibrate(cls, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any]:
        """Fit the model on ``fit`` (its threshold for ``cal.target``) into ``cal.workdir``."""
        shared = cal.shared
        model = fit_model(fit, k=shared.get("k", 10), steps=shared.get("steps", []), target=cal.target)
        path = Path(cal.workdir) / f"learned-{cal.tag}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
        return {"model_path": str(path)}
