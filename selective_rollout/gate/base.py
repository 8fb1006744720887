"""The gate contract: decide, from a group's first K actions, whether to stop the whole group.

Every gate answers ``decide(group) -> GateDecision`` and says, through ``should_check(step)``,
at which steps it wants to be asked, so the coordinator never needs to know which gate it runs.
A gate that learns from finished groups (history, audits) overrides ``observe(record)``, which
the coordinator calls with every finished group, and may report its state through ``metrics()``.
A new gate is one class in a file of its own, with a ``Params`` model next to it if it has
parameters of its own, plus one line in ``selective_rollout/plugins.py`` (docs/gate.md).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from selective_rollout.gate.distance import check_group, prefix_edit_distance
from selective_rollout.gate.features import divergence_features
from selective_rollout.gate.tracker import DivergenceTracker
from selective_rollout.records import GroupRecord, rewards_equal
from selective_rollout.registry import Registry, bind

# every gate by name: the shipped ones are lines of selective_rollout.plugins, a third party's an
# entry point of the group "selective_rollout.gates", any other class is named by its path
GATES: Registry = Registry(
    "gate",
    "selective_rollout.gates",
    base=f"{__name__}:Gate",
    params_base=f"{__name__}:GateParams",
    check=f"{__name__}:check_gate",
    catalog="selective_rollout.plugins:GATE_CATALOG",
)

Mode = Literal["at_k", "from_k"]


@dataclass(frozen=True)
class GateDecision:
    stop: bool
    reason: str
    features: dict[str, float] = field(default_factory=dict)


@dataclass
class GroupView:
    """What a gate may look at: the group's actions so far, which trajectories ended, the step,
    and the task it plays (``task_id``, and its family ``task_type`` such as ALFWorld's
    ``pick_and_place``; None where the runner does not know them).

    ``tracker`` (optional) supplies D_K incrementally; ``final_rewards`` exists only offline
    and is read by the oracle alone.
    """

    actions: Sequence[Sequence[str]]
    step: int
    ended: Sequence[bool] | None = None
    tracker: DivergenceTracker | None = None
    final_rewards: Sequence[float] | None = None
    task_id: str | None = None
    task_type: str | None = None
    _distances: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_group(self.actions)
        if self.ended is not None and len(self.ended) != len(self.actions):
            raise ValueError(f"ended has {len(self.ended)} flags for {len(self.actions)} trajectories")

    def distance(self, k: int) -> float:
        """D_k (the state is a snapshot: computed once per k)."""
        if k not in self._distances:
            if self.tracker is not None:
                self._distances[k] = self.tracker.distance(k)
            else:
                self._distances[k] = prefix_edit_distance(self.actions, k, self.ended)
        return self._distances[k]


class GateParams(BaseModel):
    """The parameters every gate shares: when it looks. A gate's own parameters extend this model
    (``class Params(GateParams)``), so that its defaults, bounds and descriptions live with the
    gate and the run config, the offline sweep and the configuration reference read them from
    there instead of repeating them."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(10, ge=1, description="step at which the gate looks (K)")
    mode: Mode = Field(
        "at_k", description="at_k: decide once at step K (the paper); from_k: at every step >= K"
    )
    steps: list[int] = Field(
        default_factory=list,
        description="at_k only: later steps (> k) at which the gate asks again, e.g. [6, 8] with k=4, "
        "so a group still diverse at K can be cut later; [] (the paper): K alone",
    )

    @model_validator(mode="after")
    def _steps_after_k(self) -> GateParams:
        if self.steps and self.mode != "at_k":
            raise ValueError(f"steps={self.steps} needs mode=at_k (from_k already asks at every step >= k)")
        if any(s <= self.k for s in self.steps) or len(set(self.steps)) != len(self.steps):
            raise ValueError(f"steps must be distinct and all > k={self.k}, got {self.steps}")
        self.steps = sorted(self.steps)
        return self


def check_gate(name: str, cls: type[Gate]) -> None:
    """A gate's own refusals at registration (``GATES`` runs it on load)."""
    if "name" in cls.Params.model_fields:
        raise TypeError(f"gate {name!r}: a parameter cannot be called 'name' (the gate's registry name)")
    if cls.threshold is not None and cls.threshold not in cls.own_params():
        raise TypeError(f"gate {name!r}: threshold {cls.threshold!r} is not one of its own parameters")


# class decorator for a gate defined in code that runs anyway (a shipped gate is a line in
# selective_rollout/plugins.py, a third party's an entry point of the group "selective_rollout.gates")
register_gate = GATES.register


def gate_class(name: str) -> type[Gate]:
    """The gate class registered under ``name``, with a clear error for an unknown name."""
    return GATES.get(name)


def build_gate(name: str, **params: Any) -> Gate:
    """A registered gate by name with its parameters, for code that builds one by hand: the same
    binding as a config section's (``GATES.build``), so a bad value is the same one line."""
    return GATES.build(name, params)  # type: ignore[no-any-return]


@dataclass
class Calibration(ABC):
    """How a gate is calibrated on the fit part of a log: the target, the shared keys, and
    ``score``, a gate's summary (``precision``, ``saved``, ...) over groups."""

    target: float  # the precision to keep on the fit part
    shared: dict[str, Any] = field(default_factory=dict)  # k, mode, steps for every gate
    audit_budget: float = 0.0
    audit_target: float = 0.9
    thresholds: Sequence[float] = tuple(i / 100 for i in range(101))
    workdir: Path = Path(".")  # where a gate may write what it fits (a learned model)
    tag: str = "fit"  # names those files (one per fold and target)
    online: tuple[int, int] | None = None  # a gate that can choose its step online does, in first..last
    prior: int | None = None  # online: start at this step instead of the one fitted on the fit part

    @abstractmethod
    def score(self, gate: Gate, groups: Sequence[GroupRecord]) -> dict[str, float]:
        """``gate`` over ``groups``: at least its ``precision`` and the share of step-tokens ``saved``."""


class Gate:
    """Interface. ``k`` is the first step at which the gate looks.

    ``Params`` declares the gate's parameters (its own on top of the shared ``k`` and ``mode``);
    ``threshold`` names the one of them that an offline sweep varies (None: nothing to sweep);
    ``offline_only`` marks a gate that needs final rewards and so cannot run in training.
    """

    name: ClassVar[str] = "gate"
    Params: ClassVar[type[GateParams]] = GateParams
    threshold: ClassVar[str | None] = None
    offline_only: ClassVar[bool] = False

    def __init__(self, params: GateParams | None = None, **values: Any) -> None:
        """Bound to ``params`` (its ``Params``, as ``GATES.build`` passes) or to keyword values."""
        name = self.name if self.name != Gate.name else type(self).__name__  # not loaded by GATES
        self.params = bind(self.Params, params, owner=f"gate {name!r}", **values)

    @classmethod
    def own_params(cls) -> dict[str, FieldInfo]:
        """The gate's own parameters (not the shared ``k`` and ``mode``), by name."""
        return {n: f for n, f in cls.Params.model_fields.items() if n not in GateParams.model_fields}

    @property
    def k(self) -> int:
        return self.params.k

    @property
    def mode(self) -> Mode:
        return self.params.mode

    @property
    def decision_steps(self) -> list[int]:
        """The steps of an ``at_k`` schedule: K, then ``steps``."""
        return [self.k, *self.params.steps]

    def should_check(self, step: int) -> bool:
        """True at the steps where the coordinator must ask :meth:`decide`."""
        return step in self.decision_steps if self.mode == "at_k" else step >= self.k

    def decide(self, group: GroupView) -> GateDecision:
        raise NotImplementedError

    def observe(self, record: GroupRecord) -> None:
        """A group has finished (any outcome; the coordinator calls this for every one it records).

        Stateless gates ignore it. A cut group's final rewards are unknown (``record.zero_variance``
        is None); audited and uncut groups carry them."""

    def metrics(self) -> dict[str, float]:
        """The gate's own state for the run's metrics (logged as ``gate/state/<key>``; the run report
        shows the last values); {} by default."""
        return {}

    @classmethod
    def calibrate(cls, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any] | None:
        """Offline: the gate's own parameters fitted on logged groups ``fit`` for ``cal.target``
        precision (the held-out evaluation, gate/offline/heldout.py, evaluates them on other groups).
        None: the default, the ``threshold`` value that saves the most on ``fit`` at that precision."""
        return None


class NoGate(Gate):
    """Never stops a group; the ungated baseline."""

    def should_check(self, step: int) -> bool:
        return False

    def decide(self, group: GroupView) -> GateDecision:
        return GateDecision(False, "no gate")


class OracleGate(Gate):
    """Stops exactly the zero-variance groups at K; needs final rewards, so evaluation only."""

    offline_only = True

    def decide(self, group: GroupView) -> GateDecision:
        if group.final_rewards is None:
            raise ValueError("the oracle gate needs final rewards; it exists for offline evaluation only")
        stop = rewards_equal(group.final_rewards)
        spread = max(group.final_rewards) - min(group.final_rewards)
        return GateDecision(stop, "zero variance" if stop else "mixed rewards", {"reward_spread": spread})


def features_at(group: GroupView) -> dict[str, float]:
    """All divergence features of the group at its current step (for logging)."""
    return divergence_features(group.actions, group.step, group.ended)


def __getattr__(name: str) -> Any:
    """``GroupState``, the gate's snapshot under its former name, for one more release: gates
    written against it keep working and are told the new name once."""
    if name == "GroupState":
        warnings.warn(
            "selective_rollout.gate.GroupState is now GroupView; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return GroupView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
