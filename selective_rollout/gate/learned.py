"""The ``learned`` gate: a logistic model of P(zero variance) over the divergence features at the
decision step (and the step itself), fit offline from logged rollouts.

    python -m selective_rollout.gate.fit --rollouts A.jsonl [B.jsonl ...] --k 4 --out gate.json
    python -m selective_rollout.train ... gate.name=learned gate.k=4 gate.model_path=gate.json

The model file (JSON, written by gate/fit.py) holds the feature names, their standardisation
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
from typing import TYPE_CHECKING, Any

from pydantic import Field

from selective_rollout.gate.features import divergence_features
from selective_rollout.gate.policies import Gate, GateDecision, GateParams, GroupState, register_gate
from selective_rollout.records import GroupRecord

if TYPE_CHECKING:
    from selective_rollout.gate.replay import Calibration

FORMAT = "selective-rollout/learned-gate"
VERSION = 1

# what the gate can compute online at any decision step (observation_unique_ratio needs the
# observations, which a GroupState does not carry); "step" is the decision step itself
FEATURES = (
    "prefix_edit_distance",
    "unique_prefix_ratio",
    "unique_action_ratio",
    "bigram_jaccard_distance",
    "termination_frac",
    "action_entropy",
    "step",
)


def decision_features(group: GroupState) -> dict[str, float]:
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
                "(write one with python -m selective_rollout.gate.fit)"
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


class LearnedParams(GateParams):
    model_path: str | None = Field(
        None, description="the model file written by python -m selective_rollout.gate.fit (required)"
    )
    p_stop: float | None = Field(
        None, ge=0.0, le=1.0, description="stop when P(zero variance) >= this; unset: the file's threshold"
    )


@register_gate("learned")
class LearnedGate(Gate):
    """A logistic model of P(zero variance) over the divergence features at the decision step (and
    the step), fit offline by ``python -m selective_rollout.gate.fit``; stops when P >= its
    threshold."""

    Params = LearnedParams
    threshold = "p_stop"
    params: LearnedParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.params.model_path is None:
            raise ValueError(
                "gate 'learned' needs model_path, the file python -m selective_rollout.gate.fit writes"
            )
        self.model = LearnedModel.load(self.params.model_path)
        schedule, fitted = self.decision_steps, [self.model.k, *self.model.steps]
        if self.mode != "at_k" or schedule != fitted:
            raise ValueError(
                f"the learned gate model {self.params.model_path} was fit at k={self.model.k} "
                f"steps={self.model.steps} (mode at_k), its threshold is for that schedule; set "
                f"gate.k={self.model.k} gate.steps={self.model.steps} (this gate: k={self.k} "
                f"steps={self.params.steps} mode={self.mode})"
            )

    @property
    def p_stop(self) -> float:
        return self.model.threshold if self.params.p_stop is None else self.params.p_stop

    def decide(self, group: GroupState) -> GateDecision:
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
        from selective_rollout.gate.fit import fit_model

        shared = cal.shared
        model = fit_model(fit, k=shared.get("k", 10), steps=shared.get("steps", []), target=cal.target)
        path = Path(cal.workdir) / f"learned-{cal.tag}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
        return {"model_path": str(path)}
