"""Replay logged groups through a gate as a run would have met them, in log order.

The offline sweep (analysis/gate_eval/evaluate.py) asks a stateless gate about each group at K. Gates with
memory (``history``, ``precision_target``) need more: the groups must reach them in the order a
run finishes them, the gate must be told of each finished group (``Gate.observe``) exactly as
the coordinator tells it, and what it is told must hide what a run would not know. So here:

- each labelled group (final rewards known, G >= 2) is asked about at the gate's steps, truncated
  to the first s actions of every trajectory (a trajectory whose log ends by step s has ended),
  never further than a run could see; the first stop decides;
- a stop is audited or not by the run's own rule (``gate.audit.AuditBudget``); the gate then
  observes the group as the coordinator would have recorded it: a cut group truncated at its
  gate step with unknown rewards, an audited or uncut one whole with its rewards;
- a cut saves what the group spent after its gate step and never reaches the learner; an audited
  stop saves nothing (it ran on in shadow) but counts as the gate's decision for precision and
  recall, and reaches the learner when informative, as the coordinator trains on it.

``summarize`` turns the outcomes into precision, recall, step-tokens saved and their share of the
oracle's saving (cut exactly the zero-variance groups at K, no audit), and the change in step-tokens
per informative group reaching the learner against no gate (what the cuts save, over the
informative groups they lose: the offline twin of the experiment's paired figure). ``ReplayCalibration``
scores a gate this way for the calibration of the held-out evaluation (analysis/gate_eval/heldout.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from selective_rollout.gate.audit import AuditBudget
from selective_rollout.gate.base import Calibration, Gate
from selective_rollout.gate.snapshot import labelled, live_after, memo, state_at, tokens_after
from selective_rollout.lifecycle import GroupLifecycle
from selective_rollout.records import GateRecord, GroupRecord, Trajectory, TrajectoryStatus
from selective_rollout.stats import grpo_advantages

EPS = 1e-6  # the trainer's default advantage_eps (a test keeps them equal)


def schedule(gate: Gate, record: GroupRecord) -> list[int]:
    """The steps at which a run would ask ``gate`` about this group, in order."""
    longest = max(len(t.steps) for t in record.trajectories)
    steps = gate.decision_steps if gate.mode == "at_k" else range(gate.k, longest)
    return [s for s in steps if gate.should_check(s) and live_after(record, s)]


def ask(gate: Gate, record: GroupRecord) -> GateRecord | None:
    """The gate's decisions on the group along its schedule: the stopping one, else the last one
    (None when it was never asked)."""
    decision = None
    for s in schedule(gate, record):
        verdict = gate.decide(state_at(record, s, with_rewards=gate.offline_only))
        decision = GateRecord(
            step=s, stop=verdict.stop, reason=verdict.reason, features=dict(verdict.features)
        )
        if verdict.stop:
            break
    return decision


def as_recorded(record: GroupRecord, decision: GateRecord | None, audited: bool) -> GroupRecord:
    """What the coordinator would have written for the labelled group under this gate: its
    lifecycle driven as a run drives it (``selective_rollout.lifecycle``), a cut group truncated at
    its gate step with its rewards unknown."""
    life = GroupLifecycle()
    if decision is not None and decision.stop:
        life.gate_fired()
        life.audit_decided(audited)
    else:
        life.trajectories_ended()
    verdict = life.settle([t.reward for t in record.trajectories], keep=lambda zero_variance: True)
    if not life.stopped:
        return replace(record, outcome=verdict.outcome, gate=decision)
    cut = [
        Trajectory(
            t.index, list(t.steps[: decision.step]), reward=None, won=False, status=TrajectoryStatus.CUT
        )
        for t in record.trajectories
    ]
    return replace(record, trajectories=cut, outcome=verdict.outcome, gate=decision)


@dataclass(frozen=True)
class GroupOutcome:
    """One labelled group under one gate: what it decided and what that was worth."""

    task_id: str
    zero_variance: bool
    stopped: bool
    audited: bool
    step: int | None  # the gate step of a stop
    saved: int  # step-tokens a cut saved (0 when audited or not stopped)
    total: int  # step-tokens the group spent ungated
    oracle: int  # step-tokens the oracle saves on it (cut at K when zero-variance)
    adv_sq: float  # squared L2 of its GRPO advantages (0 for a zero-variance group)
    succeeded: bool = False  # zero-variance with every trajectory rewarded (all-succeed, not all-fail)
    live_at_k: bool = True  # a trajectory still ran after the gate's first step (else it could not be cut)

    def row(self) -> list[float]:
        """The numbers ``summarize`` sums, as one row (bootstrap resamples rows of a task together)."""
        tp = self.stopped and self.zero_variance
        cut = self.stopped and not self.audited
        return [
            float(self.stopped),
            float(tp),
            float(self.zero_variance),
            float(self.saved),
            float(self.total),
            float(self.oracle),
            self.adv_sq,
            0.0 if cut else self.adv_sq,
            float(self.audited),
            float(not self.zero_variance),
            float(cut and not self.zero_variance),
            *self._by_class(tp),
        ]

    def _by_class(self, tp: bool) -> list[float]:
        """Per class of zero-variance group (all-fail, all-succeed): how many could be cut (still
        running at the gate's first step), how many of those the gate stopped, and the step-tokens
        its cut and the oracle's saved on them (what the class held to save)."""
        fail = self.zero_variance and not self.succeeded
        succeed = self.zero_variance and self.succeeded
        return [
            float(fail and self.live_at_k),
            float(fail and self.live_at_k and tp),
            float(succeed and self.live_at_k),
            float(succeed and self.live_at_k and tp),
            float(self.saved if fail else 0),
            float(self.saved if succeed else 0),
            float(self.oracle if fail else 0),
            float(self.oracle if succeed else 0),
        ]


def replay(
    gate: Gate,
    groups: Sequence[GroupRecord],
    audit_budget: float = 0.0,
    audit_target: float = 0.9,
    oracle_k: int | None = None,
) -> list[GroupOutcome]:
    """Run ``gate`` over labelled ``groups`` in order (see the module doc); the gate keeps what it
    observed, so a gate warmed up on earlier logs can be replayed on later ones."""
    audits = AuditBudget(audit_budget, audit_target)
    k = gate.k if oracle_k is None else oracle_k
    out = []
    for record in labelled(groups):
        decision = ask(gate, record)
        stopped = decision is not None and decision.stop
        audited = False
        if stopped:
            audited = audits.want_audit()
            audits.decided(audited)
        seen = as_recorded(record, decision, audited)
        audits.observe(seen)
        gate.observe(seen)
        zero = bool(record.zero_variance)
        out.append(
            GroupOutcome(
                task_id=record.task_id,
                zero_variance=zero,
                stopped=stopped,
                audited=audited,
                step=decision.step if stopped else None,  # type: ignore[union-attr]
                saved=tokens_after(record, decision.step) if stopped and not audited else 0,  # type: ignore[union-attr]
                total=tokens_after(record),
                oracle=tokens_after(record, k) if zero and live_after(record, k) else 0,
                adv_sq=memo(record, ("adv",), lambda r=record: _advantage_sq(r)),
                succeeded=record.reward_class == "all-succeed",
                live_at_k=live_after(record, gate.k),
            )
        )
    return out


def _advantage_sq(record: GroupRecord) -> float:
    rewards = [float(r) for r in record.rewards]  # type: ignore[arg-type]
    return float((grpo_advantages(rewards, EPS) ** 2).sum())


# the columns of GroupOutcome.row
STOPS, TP, ZERO, SAVED, TOTAL, ORACLE, ADV, ADV_KEPT, AUDITED, INFORMATIVE, LOST = range(11)
FAIL_LIVE, FAIL_STOPPED, SUCCEED_LIVE, SUCCEED_STOPPED = range(11, 15)
SAVED_FAIL, SAVED_SUCCEED, ORACLE_FAIL, ORACLE_SUCCEED = range(15, 19)
ROW_WIDTH = 19


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _per_informative(s: np.ndarray) -> float:
    """(step-tokens spent / informative groups kept) over the same without the gate, minus 1: < 0
    when the gate pays. NaN (not defined) without informative groups, or when it lost all of them."""
    if not s[TOTAL] or s[INFORMATIVE] == s[LOST]:
        return math.nan
    return (s[TOTAL] - s[SAVED]) / s[TOTAL] * s[INFORMATIVE] / (s[INFORMATIVE] - s[LOST]) - 1.0


STATISTICS = {
    "precision": lambda s: _ratio(s[TP], s[STOPS]),
    "recall": lambda s: _ratio(s[TP], s[ZERO]),
    # per class, over the groups still running at the gate's first step (the others cannot be cut)
    "recall_all_fail": lambda s: _ratio(s[FAIL_STOPPED], s[FAIL_LIVE]),
    "recall_all_succeed": lambda s: _ratio(s[SUCCEED_STOPPED], s[SUCCEED_LIVE]),
    "saved": lambda s: _ratio(s[SAVED], s[TOTAL]),
    # the saving by class of the cut group, as a share of all step-tokens (the rest: false cuts)
    "saved_all_fail": lambda s: _ratio(s[SAVED_FAIL], s[TOTAL]),
    "saved_all_succeed": lambda s: _ratio(s[SAVED_SUCCEED], s[TOTAL]),
    "share_of_oracle": lambda s: _ratio(s[SAVED], s[ORACLE]),
    "per_informative": _per_informative,
}


def summarize(outcomes: Sequence[GroupOutcome]) -> dict[str, float]:
    """Precision and recall of the stops (audited ones included: they were the gate's decisions),
    step-tokens saved by the cuts as a share of all, of the oracle's saving, and the GRPO
    advantage L2 that survives (cut groups never reach the learner; audited ones do when informative)."""
    s = np.asarray([o.row() for o in outcomes], dtype=float).sum(axis=0) if outcomes else np.zeros(ROW_WIDTH)
    out = {name: fn(s) for name, fn in STATISTICS.items()}
    out.update(
        groups=float(len(outcomes)),
        zero_variance=s[ZERO],
        stops=s[STOPS],
        audited=s[AUDITED],
        false_stops=s[STOPS] - s[TP],
        oracle_saved=_ratio(s[ORACLE], s[TOTAL]),
        oracle_all_fail=_ratio(s[ORACLE_FAIL], s[TOTAL]),
        oracle_all_succeed=_ratio(s[ORACLE_SUCCEED], s[TOTAL]),
        adv_l2_preserved=math.sqrt(s[ADV_KEPT] / s[ADV]) if s[ADV] else 1.0,
        all_fail_live=s[FAIL_LIVE],
        all_succeed_live=s[SUCCEED_LIVE],
    )
    return out


class ReplayCalibration(Calibration):
    """Calibration by replay: a gate is scored on the fit part as a run would have met it, with
    the run's audit rule and the oracle at the evaluation's K."""

    def score(self, gate: Gate, groups: Sequence[GroupRecord]) -> dict[str, float]:
        return summarize(replay(gate, groups, self.audit_budget, self.audit_target, self.shared.get("k")))
