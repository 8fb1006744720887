"""Config of the gate (selective_rollout.gate).

The section holds what every gate shares (``name``, ``k``, ``mode``) and, as flat keys, the
parameters of the selected gate (``gate.tau=0.1``). Those are declared by the gate itself (its
``Params`` model in the gate registry), so a new gate needs no change here: this module only
checks the keys against the registry and validates them with the gate's own model.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from selective_rollout.config.base import Section, entry_params
from selective_rollout.gate.policies import GATES, Gate, GateParams, Mode, build_gate


class GateConfig(Section):
    """The gate that stops converged groups (used by the selective strategies; docs/gate.md).

    Besides ``name``, ``k`` and ``mode``, the selected gate's own parameters are keys of this
    section; any other key is refused with one line naming it.
    """

    # the selected gate's own parameters are extra keys, checked by _own_params below
    model_config = ConfigDict(extra="allow")

    name: str = Field(
        "prefix_edit",
        description="a registered gate: prefix_edit (the paper's D_K < tau), two_axis (D_K < d_low or "
        "terminated >= t_high), none, or your own (docs/gate.md); its own keys are listed below",
    )
    # the shared parameters, declared once by the gate library
    k: int = GateParams.model_fields["k"]
    mode: Mode = GateParams.model_fields["mode"]

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        gate = GATES.get(name)
        online = sorted(n for n, g in GATES.items() if not g.offline_only)
        if gate is None:
            raise ValueError(f"unknown gate {name!r}; known: {', '.join(online)}")
        if gate.offline_only:
            raise ValueError(f"gate {name!r} needs final rewards (offline only); use one of {online}")
        return name

    @model_validator(mode="before")
    @classmethod
    def _own_params(cls, data: Any) -> Any:
        """Refuse a key no gate owns or the selected gate does not own, validate the rest with the
        selected gate's ``Params`` and fill in its defaults, so the section always holds every
        parameter the gate runs with (a dumped config says exactly what ran)."""
        if not isinstance(data, dict):
            return data
        return entry_params(cls, data, GATES, lambda g: g.own_params(), _validate_own, "gate")

    def build(self) -> Gate:
        """The selected gate with the shared parameters and its own (what the coordinator runs)."""
        return build_gate(self.name, k=self.k, mode=self.mode, **(self.model_extra or {}))


def _validate_own(gate: type[Gate], given: dict[str, Any]) -> dict[str, Any]:
    return gate.Params.model_validate(given).model_dump(include=set(gate.own_params()))
