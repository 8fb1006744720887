"""Gate policies: decide, from a group's first K actions, whether to stop the whole group.

Every gate answers ``decide(group) -> GateDecision`` and says, through ``should_check(step)``,
at which steps it wants to be asked, so the coordinator never needs to know which gate it runs.
A new gate is one class with ``@register_gate("name")``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from selective_rollout.gate.distance import check_group, prefix_edit_distance
from selective_rollout.gate.features import divergence_features
from selective_rollout.gate.tracker import DivergenceTracker

Mode = Literal["at_k", "from_k"]


@dataclass(frozen=True)
class GateDecision:
    stop: bool
    reason: str
    features: dict[str, float] = field(default_factory=dict)


@dataclass
class GroupState:
    """What a gate may look at: the group's actions so far, which trajectories ended, the step.

    ``tracker`` (optional) supplies D_K incrementally; ``final_rewards`` exists only offline
    and is read by the oracle alone.
    """

    actions: Sequence[Sequence[str]]
    step: int
    ended: Sequence[bool] | None = None
    tracker: DivergenceTracker | None = None
    final_rewards: Sequence[float] | None = None

    def __post_init__(self) -> None:
        check_group(self.actions)
        if self.ended is not None and len(self.ended) != len(self.actions):
            raise ValueError(f"ended has {len(self.ended)} flags for {len(self.actions)} trajectories")

    def distance(self, k: int) -> float:
        if self.tracker is not None:
            return self.tracker.distance(k)
        return prefix_edit_distance(self.actions, k, self.ended)


GATES: dict[str, type[Gate]] = {}


def register_gate(name: str) -> Callable[[type[Gate]], type[Gate]]:
    def deco(cls: type[Gate]) -> type[Gate]:
        if name in GATES:
            raise ValueError(f"gate {name!r} is registered twice")
        cls.name = name
        GATES[name] = cls
        return cls

    return deco


def build_gate(name: str, **params: Any) -> Gate:
    """Instantiate a registered gate by name, with a clear error for an unknown name."""
    try:
        cls = GATES[name]
    except KeyError:
        raise ValueError(f"unknown gate {name!r}; registered: {', '.join(sorted(GATES))}") from None
    return cls(**params)


def _check_k(k: int) -> None:
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"gate k must be an integer >= 1, got {k!r}")


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"gate {name} must be in [0, 1], got {value!r}")


def _check_mode(mode: str) -> None:
    if mode not in ("at_k", "from_k"):
        raise ValueError(f"gate mode must be 'at_k' or 'from_k', got {mode!r}")


class Gate:
    """Interface. ``k`` is the first step at which the gate looks."""

    name: ClassVar[str] = "gate"
    k: int = 1
    mode: Mode = "at_k"

    def should_check(self, step: int) -> bool:
        """True at the steps where the coordinator must ask :meth:`decide`."""
        return step == self.k if self.mode == "at_k" else step >= self.k

    def decide(self, group: GroupState) -> GateDecision:
        raise NotImplementedError


@register_gate("none")
class NoGate(Gate):
    """Never stops a group; the ungated baseline."""

    def should_check(self, step: int) -> bool:
        return False

    def decide(self, group: GroupState) -> GateDecision:
        return GateDecision(False, "no gate")


@register_gate("prefix_edit")
class PrefixEditGate(Gate):
    """The paper's one-parameter gate: stop when D_K < tau."""

    def __init__(self, k: int = 10, tau: float = 0.12, mode: Mode = "at_k") -> None:
        _check_k(k)
        _check_unit("tau", tau)
        _check_mode(mode)
        self.k, self.tau, self.mode = k, tau, mode

    def decide(self, group: GroupState) -> GateDecision:
        d = group.distance(group.step)
        stop = d < self.tau
        op = "<" if stop else ">="
        return GateDecision(stop, f"D_{group.step}={d:.3f} {op} tau={self.tau}", {"prefix_edit_distance": d})


@register_gate("two_axis")
class TwoAxisGate(Gate):
    """The paper trainer's OR rule: stop when D_K < d_low or termination fraction >= t_high."""

    def __init__(self, k: int = 10, d_low: float = 0.12, t_high: float = 0.9, mode: Mode = "at_k") -> None:
        _check_k(k)
        _check_unit("d_low", d_low)
        _check_unit("t_high", t_high)
        _check_mode(mode)
        self.k, self.d_low, self.t_high, self.mode = k, d_low, t_high, mode

    def decide(self, group: GroupState) -> GateDecision:
        d = group.distance(group.step)
        ended = [True] * len(group.actions) if group.ended is None else list(group.ended)
        term = sum(1 for a, e in zip(group.actions, ended, strict=True) if e and len(a) <= group.step)
        term_frac = term / len(group.actions)
        features = {"prefix_edit_distance": d, "termination_frac": term_frac}
        if d < self.d_low:
            return GateDecision(True, f"D_{group.step}={d:.3f} < d_low={self.d_low}", features)
        if term_frac >= self.t_high:
            return GateDecision(True, f"terminated {term_frac:.2f} >= t_high={self.t_high}", features)
        return GateDecision(False, f"D_{group.step}={d:.3f}, terminated {term_frac:.2f}", features)


@register_gate("oracle")
class OracleGate(Gate):
    """Stops exactly the zero-variance groups at K; needs final rewards, so evaluation only."""

    def __init__(self, k: int = 10) -> None:
        _check_k(k)
        self.k = k

    def decide(self, group: GroupState) -> GateDecision:
        if group.final_rewards is None:
            raise ValueError("the oracle gate needs final rewards; it exists for offline evaluation only")
        spread = max(group.final_rewards) - min(group.final_rewards)
        stop = spread <= 1e-9
        return GateDecision(stop, "zero variance" if stop else "mixed rewards", {"reward_spread": spread})


def features_at(group: GroupState) -> dict[str, float]:
    """All divergence features of the group at its current step (for logging)."""
    return divergence_features(group.actions, group.step, group.ended)
