"""Config of the gate (selective_rollout.gate).

The section holds what every gate shares (``name``, ``k``, ``mode``) and, as flat keys, the
parameters of the selected gate (``gate.tau=0.1``). Those are declared by the gate itself (its
``Params`` model, read through ``GATES``), so a new gate needs no change here:
``EntrySection`` checks the keys against the registry and validates them with the gate's own
model, without building the gate.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from selective_rollout.config.base import EntrySection
from selective_rollout.gate.base import GATES, Gate, GateParams, Mode


class GateConfig(EntrySection):
    """The gate that stops converged groups (used by the selective strategies; docs/gate.md).

    Besides ``name``, ``k`` and ``mode``, the selected gate's own parameters are keys of this
    section; any other key is refused with one line naming it.
    """

    selector = "name"
    registry_at = "selective_rollout.gate.base:GATES"

    name: str = Field(
        "prefix_edit",
        description="a registered gate: prefix_edit (the paper's D_K < tau), two_axis (D_K < d_low or "
        "terminated >= t_high), precision_target (tau set online from audits), history (the task's "
        "earlier groups as a prior), stalled (no trajectory finished by step K), learned (a fitted model), "
        "any (several of these, each at its own step), none, or your own (docs/gate.md); its "
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

    @classmethod
    def selectable(cls, name: str, key: str | None = None) -> bool:
        """The gates a run can use: those that need final rewards are for offline evaluation."""
        return name in GATES and not GATES.get(name).offline_only

    @classmethod
    def unknown(cls, name: str, key: str | None = None) -> str:
        if name in GATES:
            return f"gate {name!r} needs final rewards (offline only); use one of {cls.names()}"
        return super().unknown(name, key)

    def build(self) -> Gate:
        """The selected gate with the shared parameters and its own (what the coordinator runs,
        built once there; the config only validates the parameters)."""
        return GATES.build(self.name, self)
