"""The precision_target gate: tau from the run's labelled groups, kept under a precision bound."""

from __future__ import annotations

import pytest

from selective_rollout.analysis.gate_eval.replay import as_recorded
from selective_rollout.gate import GroupView, build_gate
from selective_rollout.records import GateRecord
from selective_rollout.stats import clopper_pearson
from tests.gate.synthetic import converged, divergent, partly

STATE = [[f"a{s}" if s < 2 else f"t{i}-a{s}" for s in range(3)] for i in range(4)]  # D_3 = 1/3


def test_it_starts_closed_and_loosens_as_evidence_accumulates() -> None:
    gate = build_gate("precision_target", k=3, target=0.9, confidence=0.8)
    assert gate.tau == 0.0 and not gate.decide(GroupView([["a"] * 3] * 4, step=3)).stop
    for i in range(30):
        gate.observe(partly(f"t{i}", [0] * 4, shared=2))  # D_3 = 1/3, zero-variance
        if i == 3:
            assert gate.tau == 0.0  # 4 of 4 is not yet enough for a 90% bound >= 0.9
    assert gate.tau == pytest.approx(1 / 3, abs=1e-5)
    assert gate.decide(GroupView(STATE, step=3)).stop
    m = gate.metrics()
    assert m["tau_labelled"] == 30 and m["tau_precision_low"] >= 0.9
    assert m["tau_precision_low"] == pytest.approx(clopper_pearson(30, 30, 0.8)[0])
    assert len(gate.trajectory) == 2 and gate.trajectory[-1][1] == gate.tau  # one change, logged


def test_informative_groups_below_tau_tighten_it() -> None:
    gate = build_gate("precision_target", k=3)
    for i in range(30):
        gate.observe(partly(f"t{i}", [0] * 4, shared=2))
    assert gate.tau > 0.3
    for i in range(5):
        gate.observe(partly(f"m{i}", [1, 0, 0, 0], shared=2))  # same D, mixed rewards
    assert gate.tau == 0.0  # 30 of 35 (86%) cannot be certified >= 0.9


def test_the_bound_reaches_only_as_far_as_the_evidence() -> None:
    gate = build_gate("precision_target", k=3, tau_max=0.5)
    for i in range(30):
        gate.observe(converged(f"z{i}", [0] * 4))  # D = 0: zero-variance
        gate.observe(divergent(f"m{i}", [1, 0, 1, 0]))  # D = 1: mixed
    assert 0.0 < gate.tau < 0.01  # cuts D = 0, not one step further


def test_cut_groups_and_groups_over_before_k_are_ignored() -> None:
    gate = build_gate("precision_target", k=3)
    g = converged("t", [0] * 4)
    for _ in range(40):
        gate.observe(as_recorded(g, GateRecord(3, True, "", {}), audited=False))  # outcome unknown
        gate.observe(converged("short", [0] * 4, length=2))  # never reached K
    assert gate.labelled == [] and gate.tau == 0.0
    with pytest.raises(ValueError, match=r"tau_start 0\.3 > tau_max 0\.2"):
        build_gate("precision_target", tau_start=0.3, tau_max=0.2)
