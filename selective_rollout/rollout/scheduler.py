"""What every gated rollout source shares: from a task list to a batch of settled groups.

``GroupScheduler`` admits tasks (a game known to be unplayable and the strategy's pre-rollout skips
are logged as SKIPPED), starts up to ``in_flight`` groups at once, retries a group once when a
worker died under it, tops the batch up with new tasks (``refill``), settles each group through
its lifecycle, logs it and lets the gate, the audit budget and the strategy learn from it. The
run's trajectory stop rule and its audits are built here once and handed to every group. How
one group is played is the subclass's ``play``; the per-turn machinery is a ``Turns`` it composes.
The same steps (``refusal``, ``launch``, ``note_end``, ``settle``, ``write``) also serve a
continuous stream of groups (``rollout.stream``, ``driver.pipeline=stream``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selective_rollout.config import RunConfig
from selective_rollout.gate import NoGate
from selective_rollout.gate.audit import AuditBudget
from selective_rollout.records import GroupRecord, GroupWriter, Outcome, Task, read_groups
from selective_rollout.rollout.group_run import GroupRun
from selective_rollout.rollout.source import RolloutBatch, RolloutSource
from selective_rollout.rollout.strategies import STRATEGIES
from selective_rollout.rollout.turns import BadGame, EngineHandle, EngineSlots, GroupFailed, Turns
from selective_rollout.trajectory_stop.audit import StopAudits
from selective_rollout.trajectory_stop.metrics import stop_metrics

if TYPE_CHECKING:
    from selective_rollout.envs.base import EnvPool
    from selective_rollout.rollout.agent import Agent

log = logging.getLogger(__name__)


class GroupScheduler(RolloutSource):
    """Runs gated group rollouts over engines (Ray actors) and an environment's ``pool``; the
    run's environment (``cfg.env``) gives the reward rule and says which errors mean an
    unplayable game.

    Usable in-process (the unit tests drive it so) or inside the coordinator's Ray actor.
    """

    def __init__(
        self,
        cfg: RunConfig,
        engines: Sequence[EngineHandle],
        pool: EnvPool,
        agent: Agent,
        run_dir: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.rc = cfg.rollout
        self.version = 0  # the engines' policy version: what a group started now carries
        self.strategy = STRATEGIES.build(self.rc.strategy, self.rc, seed=cfg.seed)
        self.gate = cfg.gate.build() if self.strategy.uses_gate else NoGate()
        slots = EngineSlots(engines, self.rc.engine_replace_timeout_s)
        self.turns = Turns(cfg, slots, pool, cfg.env.build(), agent)
        self.writer = GroupWriter(Path(run_dir) / "rollouts.jsonl") if run_dir is not None else None
        # a gate with memory first learns the earlier runs it is given, then, in a resumed run,
        # what it had observed in this one (the driver has already rewound the log to the
        # checkpoint), so it resumes where it stopped
        for path in [*cfg.gate.observe_logs, *([self.writer.path] if self.writer is not None else [])]:
            for record in read_groups(Path(path).expanduser()):
                self.gate.observe(record)
        self.audits = AuditBudget(self.rc.audit_budget, self.rc.audit_target_precision)
        # independent of the gate: asked in every group the gate has not stopped; its audits draw
        # on the gate's budget
        self.trajectory_rule = cfg.trajectory_stop.build()
        self.stop_audits = StopAudits(self.audits, cfg.trajectory_stop.audit_target)
        self._group_seq = 0
        self._active: set[asyncio.Task] = set()  # group tasks in flight, cancelled by close()
        self._bad_games: dict[str, str] = {}  # task id -> why its game cannot be played

    @property
    @abstractmethod
    def in_flight(self) -> int:
        """How many groups run at once."""

    @abstractmethod
    async def play(self, group: GroupRun) -> None:
        """Play the opened group until it ends or is cut; raise ``GroupFailed`` when a worker dies."""

    # ------------------------------------------------------------------ scheduling
    async def rollout(self, tasks: Sequence[Task], iteration: int = 0, version: int = 0) -> RolloutBatch:
        """Roll out groups from ``tasks`` (in order) until the iteration's batch is complete;
        ``version`` is the engines' policy version, carried by every group and experience (a
        group started after newer weights reached the engines carries theirs: ``version`` is
        updated meanwhile by ``weights_updated``).

        With ``refill`` the batch is topped up to ``groups_per_iteration`` trainable groups
        (cut, filtered and failed groups are replaced by new tasks) up to a cap of
        ``max_groups_factor`` x target started groups; without it exactly the target number of
        groups is started and cut ones simply leave the batch (the paper's protocol).
        """
        self.version = version
        target = self.rc.groups_per_iteration
        cap = target if not self.rc.refill else max(target, int(target * self.rc.max_groups_factor))
        slots = self.turns.slots
        start_tokens, start_steps, t0 = self.turns.tokens, self.turns.env_steps, time.perf_counter()
        cursor, started = 0, 0
        retries: list[Task] = []
        retried: set[Hashable] = set()
        kept: list[GroupRun] = []
        records: list[GroupRecord] = []
        running: dict[asyncio.Task, tuple[Task, GroupRun]] = {}

        def want_more() -> bool:
            if started >= cap:
                return False
            return len(kept) + len(running) < target

        def work_left() -> bool:
            return want_more() and bool(retries or cursor < len(tasks))

        while True:
            while work_left() and len(running) < self.in_flight and slots.live():
                if retries:
                    task = retries.pop(0)
                else:
                    task = tasks[cursor]
                    cursor += 1
                    refused = self.refusal(task, iteration)
                    if refused is not None:
                        self.write(refused)
                        records.append(refused)
                        continue
                fut, group = self.launch(task, iteration)
                running[fut] = (task, group)
                started += 1
            if not running:
                if work_left() and not slots.live():
                    await slots.wait_for_replacement()
                    continue
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                task, group = running.pop(fut)
                try:
                    retry = self.note_end(fut, task, group, retried)
                except BaseException:
                    await cancel_all(running)
                    raise
                if retry:
                    retries.append(task)
                record, trained = self.settle(task, group, iteration)
                self.write(record)
                records.append(record)
                if trained:
                    kept.append(group)
        metrics = self.batch_metrics(records, time.perf_counter() - t0, start_tokens, start_steps)
        experiences = [e for g in kept for e in g.experiences()]
        return RolloutBatch(experiences, records, metrics, cursor, [g.group_id for g in kept])

    def refusal(self, task: Task, iteration: int) -> GroupRecord | None:
        """The SKIPPED record of a task not to be played (a game known to be unplayable, or the
        strategy's pre-rollout skip), or None to play it. Not yet logged (``write``)."""
        if task.task_id in self._bad_games:
            return self._skipped_record(task, iteration, self.version, self._bad_games[task.task_id])
        if not self.strategy.admit(task.task_id):
            return self._skipped_record(task, iteration, self.version, "skipped by the strategy")
        return None

    def launch(self, task: Task, iteration: int) -> tuple[asyncio.Task, GroupRun]:
        """Open a group for ``task`` under the engines' version and start playing it."""
        group = self._new_group(task, iteration)
        group.policy_version = self.version
        fut = asyncio.create_task(self._run(task, group))
        self._active.add(fut)
        fut.add_done_callback(self._active.discard)
        return fut, group

    def note_end(
        self,
        fut: asyncio.Task,
        task: Task,
        group: GroupRun,
        retried: set[Hashable],
        key: Hashable | None = None,
    ) -> bool:
        """Take note of a group's end: an unexpected error is raised; a dead worker fails the
        group (a game that cannot load is remembered as unplayable). Returns whether its task
        is played again (``rollout.retry_failed``): once per ``key`` in ``retried``, the keys
        of the tasks already retried (by default the task's id, as in one batch; its stream
        index in a stream, where a task's failed tries can straddle batches)."""
        exc = fut.exception()
        if exc is None:
            return False
        if not isinstance(exc, GroupFailed):
            raise exc
        group.life.fail(str(exc))
        if isinstance(exc, BadGame):
            self._bad_games[task.task_id] = str(exc)
            log.warning("%s; the task is skipped from now on", exc)
            return False
        key = task.task_id if key is None else key
        if self.rc.retry_failed and key not in retried:
            retried.add(key)
            return True
        return False

    async def _run(self, task: Task, group: GroupRun) -> None:
        await self.turns.open(task, group)
        try:
            await self.play(group)
        finally:
            await self.turns.close(group)

    def settle(
        self,
        task: Task,
        group: GroupRun,
        iteration: int,
        too_stale: Callable[[GroupRun], bool] | None = None,
    ) -> tuple[GroupRecord, bool]:
        """Settle an ended group (its lifecycle decides, the strategy's ``keep`` its one input;
        ``too_stale`` says whether a trainable group's weights lag too far to train it) and let
        the strategy, the audit budget and the gate learn from it. Returns its record, not yet
        logged (``write``), and whether the learner gets it."""
        verdict = group.settle(self.strategy.keep)
        if verdict.trained and too_stale is not None and too_stale(group):
            verdict = verdict.too_stale()
        self.strategy.observe(task.task_id, verdict.zero_variance)
        record = group.to_record(iteration, verdict)
        self.audits.observe(record, audit_chosen=group.life.audit_chosen)
        self.stop_audits.observe(record)
        self.gate.observe(record)  # a gate with memory (history, audits) learns here
        return record, verdict.trained

    def write(self, record: GroupRecord) -> None:
        """Append a settled record to the run's rollouts log: at once in a rollout; when its
        batch is taken in a stream (``rollout.stream``)."""
        if self.writer is not None:
            self.writer.write(record)

    def _new_group(self, task: Task, iteration: int) -> GroupRun:
        group_id = self._next_group_id(iteration)
        group = GroupRun(
            group_id,
            task.task_id,
            task.task_type,
            self.rc.group_size,
            self.gate,
            self.audits,
            self.trajectory_rule,
            self.stop_audits,
        )
        group.engine_index = self.turns.slots.pick()
        group.sample_key = f"{self.cfg.seed}:{iteration}:{task.task_id}"
        return group

    def _skipped_record(self, task: Task, iteration: int, version: int, reason: str) -> GroupRecord:
        return GroupRecord(
            self._next_group_id(iteration),
            task.task_id,
            task.task_type,
            [],
            Outcome.SKIPPED,
            iteration,
            meta={"skipped": reason},
            policy_version=version,
        )

    def _next_group_id(self, iteration: int) -> str:
        """``it3-g17``: the iteration in the id keeps ids unique across a resume, which restarts
        the counter but never the iteration (evaluation groups: ``eval-g5``)."""
        self._group_seq += 1
        return f"{'eval' if iteration < 0 else f'it{iteration}'}-g{self._group_seq}"

    # ------------------------------------------------------------------ the driver's surface
    def dead_engines(self) -> list[int]:
        """Slots whose engine died (the driver replaces them, see ``replace_engine``)."""
        return self.turns.slots.dead()

    def replace_engine(self, index: int, engine: EngineHandle) -> None:
        """A fresh engine, already holding the current weights, takes over slot ``index``."""
        self.turns.slots.replace(index, engine)

    def progress(self) -> tuple[int, int]:
        """Generated tokens and env steps so far (the driver's liveness probe)."""
        return self.turns.tokens, self.turns.env_steps

    # ------------------------------------------------------------------ metrics
    def batch_metrics(
        self, records: list[GroupRecord], wall: float, tokens0: int, steps0: int
    ) -> dict[str, float]:
        outcomes = Counter(r.outcome for r in records)
        labelled = [r for r in records if r.zero_variance is not None]
        audited = [r for r in records if r.outcome is Outcome.AUDITED]
        fired = [r for r in records if r.gate is not None and r.gate.stop]
        tokens, steps = self.turns.tokens - tokens0, self.turns.env_steps - steps0
        invalid = [s.valid for r in records for t in r.trajectories for s in t.steps]
        metrics: dict[str, float] = {
            "rollout/groups_started": float(sum(v for k, v in outcomes.items() if k is not Outcome.SKIPPED)),
            "rollout/groups_completed": float(outcomes[Outcome.COMPLETED]),
            "rollout/groups_trained": float(sum(r.trained_on for r in records)),
            "rollout/groups_cut": float(outcomes[Outcome.CUT]),
            "rollout/groups_audited": float(outcomes[Outcome.AUDITED]),
            "rollout/groups_filtered": float(outcomes[Outcome.FILTERED]),
            "rollout/groups_skipped": float(outcomes[Outcome.SKIPPED]),
            "rollout/groups_failed": float(outcomes[Outcome.FAILED]),
            "rollout/groups_stale": float(outcomes[Outcome.STALE]),
            "rollout/zero_var_frac": sum(r.zero_variance for r in labelled) / len(labelled)
            if labelled
            else 0.0,
            "rollout/step_tokens": float(sum(r.step_tokens for r in records)),
            "rollout/env_steps": float(steps),
            "rollout/invalid_action_frac": (1 - sum(invalid) / len(invalid)) if invalid else 0.0,
            "rollout/success_rate": _mean(
                [t.won for r in records for t in r.trajectories if t.reward is not None]
            ),
            "rollout/wall_s": wall,
            "gate/fires": float(len(fired)),
            "system/tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "system/env_steps_per_s": steps / wall if wall > 0 else 0.0,
        }
        metrics.update({f"gate/state/{key}": float(value) for key, value in self.gate.metrics().items()})
        if self.cfg.trajectory_stop.name != "none":
            metrics.update(stop_metrics(records, self.rc.max_steps))
        if audited:
            metrics["gate/audit_n"] = float(len(audited))
            metrics["gate/audit_precision"] = sum(bool(r.zero_variance) for r in audited) / len(audited)
        return metrics

    def close(self) -> None:
        """Stop: cancel groups still in flight (an interrupted run), then close the log.

        Every group already decided is on disk; a cancelled one was never written, so
        rollouts.jsonl stays a list of whole groups.
        """
        for fut in list(self._active):
            fut.cancel()
        if self.writer is not None:
            self.writer.close()


async def cancel_all(running: dict[asyncio.Task, Any]) -> None:
    """Cancel the groups in flight and wait until each has stopped."""
    for fut in running:
        fut.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else 0.0
