"""A test gate that cuts exactly one group, the first it is asked about once a file the test owns
exists: with tests/env/held_env.py holding second turns until that file appears, a test knows a
group is cut after a given event (weights reaching the engines, say) instead of racing it.
Selected by its path (``gate.name=tests.gate.cut_once:CutOnce``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from selective_rollout.gate import Gate, GateDecision, GateParams, GroupView


class CutOnceParams(GateParams):
    after: str = Field("", description="the file whose existence lets the gate cut its one group")


class CutOnce(Gate):
    """Cuts the first group it is asked about once ``after`` exists, and no other."""

    Params = CutOnceParams
    params: CutOnceParams

    def __init__(self, params: GateParams | None = None, **values: object) -> None:
        super().__init__(params, **values)
        self.cut = False

    def decide(self, group: GroupView) -> GateDecision:
        if self.cut or not (self.params.after and Path(self.params.after).exists()):
            return GateDecision(False, "not yet" if not self.cut else "its one cut is spent")
        self.cut = True
        return GateDecision(True, f"the first group asked after {Path(self.params.after).name} appeared")
