"""Config of the gate (selective_rollout.gate).

The section holds what every gate shares (``name``, ``k``, ``mode``) and, as flat keys, the
parameters of the selected gate (``gate.tau=0.1``). Those are declared by the gate itself (its
``Params`` model in the gate registry), so a new gate needs no change here: ``EntrySection``
checks the keys against the registry and validates them with the gate's own model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from selective_rollout.config.base import EntrySection
from selective_rollout.gate.base import GATES, Gate, GateParams, Mode, build_gate


class GateConfig(EntrySection):
    """The gate that stops converged groups (used by the selective strategies; docs/gate.md).

    Besides ``name``, ``k`` and ``mode``, the selected gate's own parameters are keys of this
    section; any other key is refused with one line naming it.
    """

    selector = "name"
    kind = "gate"

    name: str = Field(
        "prefix_edit",
        description="a registered gate: prefix_edit (the paper's D_K < tau), two_axis (D_K < d_low or "
        "terminated >= t_high), precision_target (tau set online from audits), history (the task's "
        "earlier groups as a prior), stalled (no trajectory finished by step K), learned (a fitted model), "
        "none, or your own (docs/gate.md); its "
        "own keys are listed below",
    )
    # the shared parameters, declared once by the gate library
    k: int = GateParams.model_fields["k"]
    mode: Mode = GateParams.model_fields["mode"]
    steps: list[int] = GateParams.model_fields["steps"]
    observe_logs: list[str] = Field(
        default_factory=list,
        description="rollouts.jsonl files of earlier runs on the same tasks that the gate observes, in "
        "order, before this run's first group: a gate with memory (history) starts knowing them, e.g. "
        "a previous run of the same training; stateless gates ignore them",
    )

    @field_validator("observe_logs")
    @classmethod
    def _logs_exist(cls, paths: list[str]) -> list[str]:
        missing = [p for p in paths if not Path(p).expanduser().is_file()]
        if missing:
            raise ValueError(f"no such rollouts log: {', '.join(missing)}")
        return paths

    @model_validator(mode="after")
    def _builds(self) -> GateConfig:
        """Build the gate once, so that what only the shared and own keys together decide (steps
        against k; a learned gate's model file against k) is a config error at load, not a
        failure of the coordinator later."""
        self.build()
        return self

    @classmethod
    def entries(cls) -> Mapping[str, Any]:
        """The gates a run can use: those that need final rewards are for offline evaluation."""
        return {name: gate for name, gate in GATES.items() if not gate.offline_only}

    @classmethod
    def unknown(cls, name: str) -> str:
        if name in GATES:
            return f"gate {name!r} needs final rewards (offline only); use one of {sorted(cls.entries())}"
        return super().unknown(name)

    def build(self) -> Gate:
        """The selected gate with the shared parameters and its own (what the coordinator runs)."""
        return build_gate(self.name, k=self.k, mode=self.mode, steps=self.steps, **(self.model_extra or {}))
