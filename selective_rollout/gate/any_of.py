"""The ``any`` gate: stop a group when any of its member gates would, each asked at its own step.

Zero-variance groups come in two kinds that no single signal reads both of. All-fail groups
wander (each rollout tries another receptacle) and never finish: diverse at K, so a divergence
gate never cuts them, while ``stalled`` (no success by a late step) does. All-succeed groups
converge and finish early: the paper's D_K reads them at an early K, ``stalled`` never. A
composed gate, e.g. ``stalled`` at step 11 OR ``prefix_edit`` at K = 4, takes both halves; the
paper trainer's ``two_axis`` rule (D_K or terminated, both at one K) is the baseline it must beat.

Members are gates from the registry with their own parameters, written as in a ``gate:`` section
(``{name: stalled, k: 11}``); a member without ``k`` looks at the gate's ``k`` (with its
``steps``), when one is given. The gate itself is asked from its earliest member's step on, which
becomes its ``k`` (what the run's regime row and the per-class recall count from). Members keep
their own state (an online step, a tau set from audits), observe every finished group and report
their metrics under their names.

Calibrated on a log (gate/offline/heldout.py), each member is calibrated alone at the target;
where their union is less precise on the fit part than the target, the members are calibrated
again at stricter targets until it is not.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field, model_validator

from selective_rollout.gate.base import (
    GATES,
    Calibration,
    Gate,
    GateDecision,
    GateParams,
    GroupView,
    build_gate,
)
from selective_rollout.gate.calibration import calibrated_params, meets
from selective_rollout.records import GroupRecord
from selective_rollout.registry import bind

SHARED = tuple(GateParams.model_fields)  # k, mode, steps
TIGHTEN = 0.02  # how much stricter each member's target gets when the union falls short


class AnyParams(GateParams):
    members: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "stalled", "k": 11}, {"name": "prefix_edit", "k": 4, "tau": 0.01}],
        description="the gates composed, each {name: <gate>, <its parameters>}; a group stops when any "
        "member, asked at its own steps, would stop it",
    )

    @model_validator(mode="after")
    def _resolve_members(self) -> AnyParams:
        """Each member validated by its own ``Params`` and written out whole (so validating the
        result again gives the same gate); the gate's own k, mode and steps derived from them."""
        if not self.members:
            raise ValueError("members: give at least one gate")
        explicit_k = "k" in self.model_fields_set
        resolved = []
        for i, member in enumerate(self.members):
            name = member.get("name")
            if not isinstance(name, str):
                raise ValueError(f"members[{i}] has no name (a registered gate)")
            if name not in GATES:
                raise ValueError(f"members[{i}]: {GATES.unknown(name)}")
            if GATES.get(name).offline_only:
                raise ValueError(f"members[{i}]: gate {name!r} needs final rewards (offline only)")
            own = {key: value for key, value in member.items() if key != "name"}
            inherited: dict[str, Any] = {"mode": self.mode}
            if explicit_k and "k" not in own:
                inherited.update(k=self.k, steps=self.steps)
            params = bind(GATES.params(name), {**inherited, **own}, owner=f"members[{i}] ({name})")
            resolved.append({"name": name, **params.model_dump(mode="json")})
        self.members = resolved
        self.k = min(m["k"] for m in resolved)
        self.mode = "from_k" if any(m["mode"] == "from_k" for m in resolved) else "at_k"
        self.steps = []
        return self


class AnyGate(Gate):
    """Stop when any member gate, asked at its own steps, would stop the group."""

    Params = AnyParams
    params: AnyParams

    def __init__(self, params: GateParams | None = None, **values: Any) -> None:
        super().__init__(params, **values)
        self.gates = [build_gate(**member) for member in self.members]
        names = [m["name"] for m in self.members]
        self.labels = [n if names.count(n) == 1 else f"{n}{i}" for i, n in enumerate(names)]

    @property
    def members(self) -> list[dict[str, Any]]:
        return self.params.members

    @property
    def decision_steps(self) -> list[int]:
        return sorted({s for gate in self.gates for s in gate.decision_steps})

    def should_check(self, step: int) -> bool:
        return any(gate.should_check(step) for gate in self.gates)

    def decide(self, group: GroupView) -> GateDecision:
        features: dict[str, float] = {}
        reasons = []
        for label, gate in zip(self.labels, self.gates, strict=True):
            if not gate.should_check(group.step):
                continue
            verdict = gate.decide(group)
            features.update(verdict.features)
            reasons.append(f"{label}: {verdict.reason}")
            if verdict.stop:
                return GateDecision(True, reasons[-1], features)
        return GateDecision(False, "; ".join(reasons) or "no member looks at this step", features)

    def observe(self, record: GroupRecord) -> None:
        for gate in self.gates:
            gate.observe(record)

    def metrics(self) -> dict[str, float]:
        return {
            f"{label}_{key}": value
            for label, gate in zip(self.labels, self.gates, strict=True)
            for key, value in gate.metrics().items()
        }

    @classmethod
    def calibrate(cls, fit: list[GroupRecord], cal: Calibration) -> dict[str, Any]:
        """Each member calibrated alone at the target, at stricter ones while the union falls short
        on ``fit`` (at 1.0 every member stops only where it is never wrong there, or never). A
        member's step is where its search starts, at the evaluation's K at the latest."""
        members = cls.Params.model_validate(cal.shared).members
        strictness = 0.0
        while True:
            target = min(1.0, cal.target + strictness)
            tuned = []
            for i, member in enumerate(members):
                # a member that calibrates its own step searches from the evaluation's K on
                shared = {key: member[key] for key in SHARED}
                shared["k"] = min(member["k"], cal.shared.get("k", member["k"]))
                own = replace(cal, target=target, shared=shared, tag=f"{cal.tag}-member{i}")
                tuned.append({**member, **calibrated_params(member["name"], fit, own)})
            params = {"members": tuned}
            if target >= 1.0 or meets(cal.score(cls(**cal.shared, **params), fit)["precision"], cal.target):
                return params
            strictness += TIGHTEN
