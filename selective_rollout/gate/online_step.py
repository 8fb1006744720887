"""A gate's decision step chosen online, from the run's own labelled groups.

How late a rule must look to be precise depends on the tasks and the policy: ``stalled`` held out
at one target precision calibrated to step 7 on one fold of tasks and to 14 on another. A step
fixed in advance is right for the task set it was measured on only. ``OnlineStep`` keeps, for
every candidate step s, how many of the run's labelled groups (uncut, and audited stops, whose
final rewards are known) the rule would have cut at s and how many of those had zero variance,
and sets the step in force after each:

- the earliest candidate whose cut set has an exact (Clopper-Pearson) lower bound of precision
  >= ``target``: the evidence says cutting there is precise enough;
- else the earliest candidate, not before the prior, whose upper bound is still >= ``target``:
  the prior (the shipped step) holds until the evidence is against it, then the step moves later;
- else none: no step is precise enough, and the gate stops nothing.

A group cut at the step in force is labelled only when audited, and the uncut groups are the ones
the rule let through: counting labelled groups alone, an earlier step's cut set would hold the
late successes and miss the groups cut since, and the step could never move earlier. So a cut
group that was not audited still counts at every earlier step at which the rule would have cut
it (it was stalled then too), with the audited share of zero-variance groups standing for its
class: the audits are a sample of the cut groups. The bounds take the audited share's own
interval, lower end for the lower bound and upper end for the upper one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from selective_rollout.gate.snapshot import live_after
from selective_rollout.records import GroupRecord, Outcome
from selective_rollout.stats import clopper_pearson

Stops = Callable[[GroupRecord, int], bool]  # would the rule cut this finished group at step s?


class OnlineStep:
    """The step in force of a rule over ``candidates``, starting at ``prior``."""

    def __init__(
        self, prior: int, candidates: Sequence[int], target: float, confidence: float, stops: Stops
    ) -> None:
        if prior not in candidates:
            raise ValueError(f"the prior step {prior} is not among the candidates {list(candidates)}")
        self.prior, self.candidates = prior, sorted(candidates)
        self.target, self.confidence, self.stops = target, confidence, stops
        self.cut = {s: 0 for s in self.candidates}  # labelled groups the rule cuts at s
        self.zero = {s: 0 for s in self.candidates}  # of them, zero-variance
        self.unlabelled = {s: 0 for s in self.candidates}  # cut, not audited, stalled at s already
        self.labelled = 0
        self.audited = self.audited_zero = 0  # audited stops, and of them zero-variance
        self.step: int | None = prior
        self.changes: list[tuple[int, int | None]] = [(0, prior)]  # (labelled groups, step) at each change

    def observe(self, record: GroupRecord) -> None:
        """A finished group: labelled where its final rewards are known (uncut or audited); a cut
        one counted at the steps before its cut at which the rule would have cut it."""
        zero = record.zero_variance
        if record.g < 2:
            return
        if zero is None:
            if record.outcome is not Outcome.CUT or record.gate is None:
                return  # a failed group
            for s in self.candidates:
                if s < record.gate.step and live_after(record, s) and self.stops(record, s):
                    self.unlabelled[s] += 1
        else:
            self.labelled += 1
            if record.outcome is Outcome.AUDITED:
                self.audited += 1
                self.audited_zero += zero
            for s in self.candidates:
                if live_after(record, s) and self.stops(record, s):
                    self.cut[s] += 1
                    self.zero[s] += zero
        step = self._choose()
        if step != self.step:
            self.changes.append((self.labelled, step))
        self.step = step

    def bounds(self, step: int) -> tuple[float, float]:
        """The interval of the rule's precision at ``step`` ((0, 1) before any cut group): its
        unlabelled cuts are zero-variance at the audited share's lower (upper) end."""
        unlabelled = self.unlabelled[step]
        n = self.cut[step] + unlabelled
        if not n:
            return 0.0, 1.0
        low, high = (
            clopper_pearson(self.audited_zero, self.audited, self.confidence) if self.audited else (0.0, 1.0)
        )
        hits_low = self.zero[step] + math.floor(unlabelled * low)
        hits_high = self.zero[step] + math.ceil(unlabelled * high)
        return (
            clopper_pearson(hits_low, n, self.confidence)[0],
            clopper_pearson(hits_high, n, self.confidence)[1],
        )

    def _choose(self) -> int | None:
        supported = [s for s in self.candidates if self.bounds(s)[0] >= self.target]
        if supported:
            return supported[0]
        plausible = [s for s in self.candidates if s >= self.prior and self.bounds(s)[1] >= self.target]
        return plausible[0] if plausible else None

    def metrics(self) -> dict[str, float]:
        """The step in force (-1: none), the labelled groups behind it and its precision bound."""
        low = self.bounds(self.step)[0] if self.step is not None else float("nan")
        return {
            "step": float(self.step if self.step is not None else -1),
            "step_labelled": float(self.labelled),
            "step_precision_low": low,
        }
