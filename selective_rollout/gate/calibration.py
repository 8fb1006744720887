"""Calibrating a gate on logged groups: pick the parameters that save the most while keeping a
target precision.

A gate's ``calibrate`` classmethod (its own search, e.g. ``stalled`` over steps and shares, or
``learned`` fitting its model) receives a ``Calibration`` (gate/base.py): the target, the shared
keys and how to score a gate on groups. The scoring is supplied by whoever calibrates (the
held-out evaluation replays logs with the run's audit rule: ``analysis.gate_eval.replay.ReplayCalibration``),
so the gates depend only on the contract, never on the offline tools.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from selective_rollout.gate.base import Calibration, build_gate, gate_class
from selective_rollout.records import GroupRecord


def meets(precision: float, target: float) -> bool:
    """A gate that never stopped keeps every informative group: it meets any target (saving 0)."""
    return math.isnan(precision) or precision >= target - 1e-12


def best_params(
    name: str, candidates: Sequence[Mapping[str, Any]], fit: Sequence[GroupRecord], cal: Calibration
) -> tuple[dict[str, Any], dict[str, float]]:
    """Among ``candidates`` (parameter sets of gate ``name``; one may set a shared key such as
    ``k``, over ``cal.shared``), the one that saves the most on ``fit`` with precision >= the
    target there (ties: the first listed); with its fit summary.
    A candidate that never stops meets any target, so list one (e.g. tau 0) to always have one."""
    best: tuple[dict[str, Any], dict[str, float]] | None = None
    for params in candidates:
        summary = cal.score(build_gate(name, **{**cal.shared, **params}), fit)
        if not meets(summary["precision"], cal.target):
            continue
        if best is None or summary["saved"] > best[1]["saved"] + 1e-12:
            best = (dict(params), summary)
    if best is None:
        raise ValueError(
            f"no candidate parameters of gate {name!r} kept precision >= {cal.target} on the fit part"
        )
    return best


def calibrated_params(name: str, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any]:
    """Gate ``name``'s own parameters for ``cal.target`` on ``fit``: its own ``calibrate``, else the
    default (its ``threshold`` over ``cal.thresholds``; a gate without one keeps its defaults)."""
    cls = gate_class(name)
    own = cls.calibrate(fit, cal)
    if own is not None:
        return own
    if cls.threshold is None:
        return {}
    return best_params(name, [{cls.threshold: t} for t in cal.thresholds], fit, cal)[0]
