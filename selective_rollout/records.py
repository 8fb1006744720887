"""Record types every layer reads: steps, trajectories, groups, learner experience.

They live at the bottom of the stack because the gate evaluation, the
coordinator, the learner's packing and the run report all consume them. They are plain
dataclasses with a stable JSON form so that ``rollouts.jsonl`` written by one version of the
coordinator stays readable by the offline gate evaluation (schema in docs/rollouts_schema.md).
No torch, no Ray here.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

SCHEMA_VERSION = 3
# schema 1: no policy_version (every group read as version 0); schema 2: no step version_runs
# (every reply read as played at its group's version)
READABLE_SCHEMAS = (1, 2, 3)

log = logging.getLogger(__name__)
T = TypeVar("T")

REWARD_TOL = 1e-9  # rewards closer than this are one reward (float sums of per-step rewards)


def rewards_equal(rewards: Sequence[float]) -> bool:
    """True when a group's final rewards are all equal: a zero-variance group, whose GRPO
    advantages are all 0. The one definition that the report, the coordinator, the oracle gate
    and the offline evaluation share, so that they never disagree on which groups carry no signal.
    An empty group has no rewards to agree: False."""
    return bool(rewards) and max(rewards) - min(rewards) <= REWARD_TOL


@dataclass(frozen=True)
class Task:
    """One prompt of the task stream: its identity and what its environment needs to play it (the
    payload is the environment's own: a game folder, a question and its answer, ...)."""

    task_id: str
    task_type: str
    payload: Mapping[str, Any] = field(default_factory=dict, hash=False)


class Outcome(str, Enum):
    """What happened to a group; decides whether it reaches the learner."""

    COMPLETED = "completed"  # ran to the end, kept for training
    CUT = "cut"  # stopped by the gate mid-trajectory, never trained on
    # stopped by the gate but run on in shadow to measure precision; trained on when it turns out
    # informative (its tokens are spent either way, and an informative group is what the batch wants)
    AUDITED = "audited"
    FILTERED = "filtered"  # ran to the end, dropped afterwards (e.g. DAPO zero variance)
    SKIPPED = "skipped"  # never started (pre-rollout skipping)
    FAILED = "failed"  # an engine or env worker died under it
    # would have trained, but the weights that played it lag the learner's by more than
    # driver.max_staleness when its batch trains (driver.pipeline=stream): dropped and counted
    STALE = "stale"

    def trains(self, zero_variance: bool | None) -> bool:
        """Whether a group with this outcome reaches the learner: kept whole, or audited and
        informative (a false stop that the audit ran to the end is an informative group like any
        other). One rule for the rollout's batch (``selective_rollout.lifecycle``) and a logged group
        (``GroupRecord.trained_on``), so the two never disagree."""
        if self is Outcome.AUDITED:
            return zero_variance is False
        return self is Outcome.COMPLETED


class TrajectoryStatus(str, Enum):
    FINISHED = "finished"  # the environment said done
    TRUNCATED = "truncated"  # hit the step cap
    CUT = "cut"  # its group was stopped by the gate
    FAILED = "failed"
    STOPPED = "stopped"  # ended early by a trajectory stop rule; its reward is the assigned one


@dataclass
class Step:
    """One turn: the policy's reply mapped to a command and the environment's answer.

    ``prompt_tokens`` counts the whole prompt of this turn's engine call (what a lock-step,
    prefix-cache-free loop such as the paper's processes), so ``step_tokens`` is comparable
    across engines; what an engine actually re-used from its KV cache is a system metric.
    """

    action: str
    valid: bool = True
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reward: float = 0.0
    done: bool = False
    # the reply's tokens by policy version, as [version, tokens] runs in order; empty when every
    # token has its group's version (weights that reach the engines mid-rollout make it differ)
    version_runs: list[list[int]] = field(default_factory=list)

    @property
    def step_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TrajectoryStop:
    """A trajectory stop rule's verdict on one trajectory of a running group, as logged.

    ``assigned`` is the reward the rule gave it at ``step``. An ``audited`` stop ran on in shadow,
    so its trajectory's ``reward`` is the true one and ``assigned == reward`` says whether the
    rule's label was right; an unaudited one ended the trajectory (status ``stopped``) with the
    assigned reward, which is then what the learner got.
    """

    step: int
    assigned: float
    rule: str
    audited: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrajectoryStop:
        assigned = _finite_or_none(d["assigned"], "assigned")
        if assigned is None:
            raise ValueError("a trajectory stop's assigned reward is null")
        return cls(int(d["step"]), assigned, str(d["rule"]), bool(d.get("audited", False)))


@dataclass
class Trajectory:
    """One of the G rollouts of a group."""

    index: int
    steps: list[Step] = field(default_factory=list)
    # final reward; None while running or when cut unaudited; the assigned one when stopped
    reward: float | None = None
    won: bool = False
    status: TrajectoryStatus = TrajectoryStatus.FINISHED
    stop: TrajectoryStop | None = None  # a trajectory stop rule's verdict, when one fired

    @property
    def actions(self) -> list[str]:
        return [s.action for s in self.steps]

    @property
    def step_tokens(self) -> list[int]:
        return [s.step_tokens for s in self.steps]

    @property
    def label_right(self) -> bool | None:
        """Whether an audited stop's assigned reward is the reward the trajectory got running on;
        None without an audited stop or without a final reward (its group was cut or failed)."""
        if self.stop is None or not self.stop.audited or self.reward is None:
            return None
        return abs(self.reward - self.stop.assigned) <= REWARD_TOL


@dataclass
class GateRecord:
    """The gate's verdict on a group, as logged."""

    step: int
    stop: bool
    reason: str
    features: dict[str, float] = field(default_factory=dict)


@dataclass
class GroupRecord:
    """A group of G trajectories of one task: one line of ``rollouts.jsonl``."""

    group_id: str
    task_id: str
    task_type: str
    trajectories: list[Trajectory]
    outcome: Outcome = Outcome.COMPLETED
    iteration: int = 0
    gate: GateRecord | None = None
    wall_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    # learner updates the weights that played the group had seen (driver.pipeline; one per group)
    policy_version: int = 0

    @property
    def g(self) -> int:
        return len(self.trajectories)

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]

    @property
    def has_final_rewards(self) -> bool:
        return bool(self.trajectories) and all(r is not None for r in self.rewards)

    @property
    def zero_variance(self) -> bool | None:
        """True when all final rewards are equal (no GRPO signal); None when unknown."""
        if not self.has_final_rewards:
            return None
        return rewards_equal([float(r) for r in self.rewards])  # type: ignore[arg-type]

    @property
    def reward_class(self) -> str | None:
        """ "all-fail" or "all-succeed" (the two halves of the zero-variance waste), "mixed", or
        None when the final rewards are unknown. A zero-variance group succeeded when its one
        reward is positive."""
        zero = self.zero_variance
        if zero is None:
            return None
        if not zero:
            return "mixed"
        return "all-succeed" if float(self.rewards[0]) > 0.0 else "all-fail"  # type: ignore[arg-type]

    @property
    def step_tokens(self) -> int:
        return sum(sum(t.step_tokens) for t in self.trajectories)

    @property
    def trained_on(self) -> bool:
        """Whether the group reached the learner (``Outcome.trains``)."""
        return self.outcome.trains(self.zero_variance)

    def tokens_after(self, step: int) -> int:
        """Step-tokens the group spent after its first ``step`` steps (what a cut there saves)."""
        return sum(sum(t.step_tokens[step:]) for t in self.trajectories)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        for t in d["trajectories"]:
            t["status"] = TrajectoryStatus(t["status"]).value
            if t["stop"] is None:  # a line of a run without trajectory stops reads as before
                del t["stop"]
            for s in t["steps"]:
                if not s["version_runs"]:  # a reply played at its group's version
                    del s["version_runs"]
        return {"schema": SCHEMA_VERSION, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupRecord:
        schema = d.get("schema", SCHEMA_VERSION)
        if schema not in READABLE_SCHEMAS:
            raise ValueError(
                f"unsupported rollouts schema version {schema} "
                f"(this reader: {', '.join(map(str, READABLE_SCHEMAS))})"
            )
        trajectories = [
            Trajectory(
                index=int(t["index"]),
                steps=[Step(**s) for s in t.get("steps", [])],
                reward=_finite_or_none(t.get("reward"), "reward"),
                won=bool(t.get("won", False)),
                status=TrajectoryStatus(t.get("status", "finished")),
                stop=TrajectoryStop.from_dict(t["stop"]) if t.get("stop") is not None else None,
            )
            for t in d["trajectories"]
        ]
        gate = d.get("gate")
        return cls(
            group_id=str(d["group_id"]),
            task_id=str(d["task_id"]),
            task_type=str(d.get("task_type", "")),
            trajectories=trajectories,
            outcome=Outcome(d.get("outcome", "completed")),
            iteration=int(d.get("iteration", 0)),
            gate=GateRecord(**gate) if gate else None,
            wall_s=float(d.get("wall_s", 0.0)),
            meta=dict(d.get("meta", {})),
            policy_version=int(d.get("policy_version", 0)),
        )


def version_runs(versions: Sequence[int], group_version: int) -> list[list[int]]:
    """A reply's per-token versions as ``Step.version_runs``: [version, tokens] runs in order, or
    [] when every token has the group's version (what a line then omits)."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return [] if all(v == group_version for v, _ in runs) else runs


def _finite_or_none(value: Any, name: str) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} is {value!r}, not a finite number")
    return number


class LogLineError(ValueError):
    """A line of a JSONL log (rollouts.jsonl, metrics.jsonl) that cannot be read, named by file and line."""


def read_jsonl(path: str | Path, parse: Callable[[dict[str, Any]], T], what: str) -> Iterator[T]:
    """Yield ``parse(obj)`` for each JSON object line of a log.

    A torn last line (a crash mid-write) is skipped with a warning, since every earlier line
    was flushed whole; a bad line anywhere else (not JSON, not an object, rejected by ``parse``)
    is an error naming the file and line.
    """
    path = Path(path)
    with path.open() as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError(f"a JSON {type(obj).__name__}, not an object")
            parsed = parse(obj)
        except (ValueError, KeyError, TypeError) as exc:
            if lineno == len(lines) and not line.endswith("\n"):
                log.warning("%s:%d: skipping a torn last line (%s)", path, lineno, exc)
                continue
            raise LogLineError(f"{path}:{lineno}: not a valid {what}: {exc}") from exc
        yield parsed


def read_groups(path: str | Path) -> Iterator[GroupRecord]:
    """Yield the groups of a rollouts.jsonl file (torn last line skipped, see ``read_jsonl``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"rollouts file not found: {path}")
    yield from read_jsonl(path, GroupRecord.from_dict, "group record")


def rewind_jsonl(path: str | Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewind a log to a checkpoint: keep the lines ``keep`` accepts and move the others (and
    any unreadable line) to ``<name>.rewound`` beside it, so a resumed run that redoes those
    iterations never repeats a record, and nothing once written is deleted. Returns how many
    lines moved. Call it before anything opens the log for appending."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, moved = [], []
    for line in path.read_text().splitlines(keepends=True):
        try:
            obj = json.loads(line) if line.strip() else None
            ok = isinstance(obj, dict) and line.endswith("\n") and keep(obj)
        except (ValueError, KeyError, TypeError):
            ok = False
        if line.strip():
            (kept if ok else moved).append(line if line.endswith("\n") else line + "\n")
    if not moved:
        return 0
    with path.with_name(path.name + ".rewound").open("a") as fh:
        fh.writelines(moved)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text("".join(kept))
    os.replace(staging, path)
    return len(moved)


class GroupWriter:
    """Appends groups to rollouts.jsonl, one flushed line each, so a crash loses nothing finished."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a")

    def write(self, group: GroupRecord) -> None:
        self._fh.write(group.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> GroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Experience:
    """One trajectory as the learner consumes it: the whole multi-turn dialogue, packed.

    ``loss_mask`` is 1 on the policy's own tokens (its replies), 0 on prompts and
    observations; ``old_logprobs`` holds the sampling engine's log-probs on masked tokens and 0
    elsewhere. Advantages are computed by the learner from ``reward`` grouped by ``group_id``, one
    reward per ``trajectory`` (a long dialogue cut into history-window segments yields several
    Experiences of one trajectory).
    """

    group_id: str
    task_id: str
    task_type: str
    token_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    reward: float
    trajectory: int = 0  # index within the group: segments of one trajectory share it and its reward
    # position -> the token ids a constrained choice allowed there (the sampled one among them);
    # positions without an entry were sampled from the model's whole vocabulary
    choice_sets: dict[int, tuple[int, ...]] = field(default_factory=dict)
    policy_version: int = 0  # learner updates the weights that sampled it had seen (GroupRecord's)
    # per token, where known: the policy version of the oldest weights its sampling depended on
    # (CompletionOutput.versions; -1 on tokens the policy did not sample); empty: all policy_version
    token_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.old_logprobs) != n:
            raise ValueError(
                f"experience {self.group_id}: token_ids ({n}), loss_mask ({len(self.loss_mask)}) "
                f"and old_logprobs ({len(self.old_logprobs)}) must have one length"
            )
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(
                f"experience {self.group_id}: token_versions ({len(self.token_versions)}) must be "
                f"empty or have one entry per token ({n})"
            )
        for pos, allowed in self.choice_sets.items():
            if not 0 <= pos < n or self.token_ids[pos] not in allowed:
                raise ValueError(
                    f"experience {self.group_id}: choice set at position {pos} must hold the token "
                    f"there (sequence of {n} tokens)"
                )
        if not math.isfinite(self.reward):
            raise ValueError(f"experience {self.group_id}: reward must be finite, got {self.reward}")

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    def token_lags(self, version: int) -> list[int]:
        """Per token, how many updates the learner at policy ``version`` is ahead of the weights
        that sampled it (0 where it is not a policy token); ``ValueError`` for a policy token
        sampled by weights newer than the learner's."""
        known = self.token_versions or [self.policy_version] * len(self.token_ids)
        lags = [
            version - (v if v >= 0 else self.policy_version) if m else 0
            for v, m in zip(known, self.loss_mask, strict=True)
        ]
        if lags and min(lags) < 0:
            raise ValueError(
                f"experience {self.group_id}: a token of policy version {version - min(lags)} is newer "
                f"than the learner's version {version}"
            )
        return lags

    def without_forced_tokens(self) -> Experience:
        """This experience with the tokens a constrained choice forced (one legal token) taken out of
        the loss: under the constrained policy their probability is 1 whatever the weights, so they
        carry no gradient and only dilute a per-token mean (about three reply tokens in four)."""
        forced = {pos for pos, allowed in self.choice_sets.items() if len(allowed) == 1}
        if not forced:
            return self
        mask = [0 if i in forced else m for i, m in enumerate(self.loss_mask)]
        return replace(self, loss_mask=mask)
