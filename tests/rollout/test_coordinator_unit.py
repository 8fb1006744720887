"""Coordinator logic with scripted doubles of the engine, env pool and agent (unit tests only).

The integration tests (test_coordinator_integration.py) run the same coordinator over real Ray,
the real ALFWorld engine and SmolLM2; here a scripted policy makes groups converge or diverge on
purpose so that every scheduling rule can be checked exactly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from selective_rollout.config import load_config
from selective_rollout.envs.base import TaskError, folder_task
from selective_rollout.records import Outcome, TrajectoryStatus, read_groups
from selective_rollout.rollout.coordinator import GroupCoordinator, evaluation_config, rollout_source
from selective_rollout.rollout.dialogue import Conversation
from selective_rollout.rollout.engines import Completion, CompletionOutput, SamplingParams
from selective_rollout.rollout.lockstep import LockstepRollout
from selective_rollout.rollout.source import RolloutSource


class _Remote:
    """Gives an async function the ``.remote`` calling convention of a Ray actor method."""

    def __init__(self, fn):
        self.remote = fn


@dataclass
class ScriptedEngine:
    """Replies with the action a script picks for (game, trajectory, step); slow enough to overlap."""

    script: dict[str, callable]
    delay: float = 0.01
    slow: dict[int, float] = field(default_factory=dict)  # trajectory index -> its own delay
    aborted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    in_flight: dict[str, asyncio.Event] = field(default_factory=dict)
    seeds: dict[tuple[int, str, str], int] = field(default_factory=dict)  # (game, traj, step) -> seed
    sessions: dict[str, str | None] = field(default_factory=dict)  # request id -> its KV session

    def __post_init__(self):
        self.generate = _Remote(self._generate)
        self.abort = _Remote(self._abort)
        self.release = _Remote(self._release)

    async def _generate(self, request_id, prompt, sampling: SamplingParams, session_id=None):
        # request ids look like it0-g3-t1-s4: iteration and group, trajectory, step
        _, t, s = request_id.rsplit("-", 2)
        game = prompt[0]
        self.seeds[(game, t, s)] = sampling.seed
        self.sessions[request_id] = session_id
        event = self.in_flight[request_id] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout=self.slow.get(int(t[1:]), self.delay))
            reason = "abort"
        except TimeoutError:
            reason = "stop"
        finally:
            self.in_flight.pop(request_id, None)
        text = self.script[GAMES[game]](int(t[1:]), int(s[1:])) if reason == "stop" else ""
        return Completion(
            request_id, len(prompt), 0, [CompletionOutput(0, [7, 8], [-0.5, -0.25], text, reason)]
        )

    async def _abort(self, request_ids):
        self.aborted += request_ids
        for rid in request_ids:
            if rid in self.in_flight:
                self.in_flight[rid].set()

    async def _release(self, session_ids):
        self.released += session_ids


GAMES = ["converge_lose", "diverge_mixed", "converge_win", "diverge_lose", "converge_mixed", "early_win"]


@dataclass
class _State:
    episode_id: str
    obs: str = "obs"
    admissible: list = field(default_factory=lambda: ["x"])
    reward: float = 0.0
    done: bool = False
    won: bool = False
    task: str = "task"
    failed: str | None = None


class ScriptedEnv:
    """Episodes end when the action is 'win' (won) or 'quit' (lost); a task's game_dir names its
    script, and so does its episodes' task sentence (what the scripted agent reads)."""

    def __init__(self, fail_games: set[str] = frozenset(), bad_games: set[str] = frozenset()):
        self.open: set[str] = set()
        self.closed: list[str] = []
        self.fail_games = set(fail_games)
        self.bad_games = set(bad_games)  # games the engine cannot load, every time
        self.resets: list[str] = []
        self.n = 0

    async def reset_group(self, task, g):
        game_dir = task.payload["game_dir"]
        self.resets.append(game_dir)
        if game_dir in self.bad_games:
            raise TaskError(f"{game_dir}/game.tw-pddl: the engine failed to load: ParseError: ...")
        if game_dir in self.fail_games:
            self.fail_games.discard(game_dir)  # fails once, like a worker that dies and restarts
            raise ConnectionError("worker died")
        states = []
        for _ in range(g):
            self.n += 1
            eid = f"{game_dir}:{self.n}"
            self.open.add(eid)
            states.append(_State(eid, task=game_dir))
        return states

    async def step(self, actions):
        await asyncio.sleep(0.001)
        out = {}
        for eid, action in actions.items():
            assert eid in self.open, f"step on closed episode {eid}"
            out[eid] = _State(
                eid, won=action == "win", done=action in ("win", "quit"), reward=float(action == "win")
            )
        return out

    async def close(self, episode_ids):
        for e in episode_ids:
            self.open.discard(e)
            self.closed.append(e)


@dataclass
class _Parsed:
    command: str
    valid: bool


class _Builder:
    """Prompt ids without a tokenizer: a prompt opens with the game's index, then 1, 2; a reply is
    followed by 3. The real ``Conversation`` builds the dialogue over it."""

    eot_id = 8  # the scripted engine's replies are [7, 8]: each ends its turn

    def __init__(self, game_index: int):
        self.game_index = game_index

    def prompt(self, exchanges, last_user):
        return [self.game_index, 1, 2]

    def continuation(self, last_user, completion_ended_turn):
        return [3]


class ScriptedAgent:
    """Prompts open with the index of the game the task sentence names (the engine's script key)."""

    def start(self, task, obs, admissible):
        return Conversation(_Builder(GAMES.index(task)), 10_000, task, obs, admissible)

    def parse(self, text, admissible):
        return _Parsed(text, bool(text))

    def sampling(self, admissible, base):
        return base


# scripts: (trajectory index, step) -> action
SCRIPTS = {
    "converge_lose": lambda t, s: "quit" if s >= 8 else "go to shelf 1",
    "diverge_mixed": lambda t, s: ("win" if t % 2 == 0 else "quit") if s >= 6 else f"go to place {t}-{s}",
    "converge_win": lambda t, s: "win" if s >= 7 else "open fridge 1",
    "diverge_lose": lambda t, s: "quit" if s >= 6 else f"look {t}-{s}",
    # the prefix_edit gate's false stop: alike at K, yet half win
    "converge_mixed": lambda t, s: ("win" if t % 2 == 0 else "quit") if s >= 6 else "go to shelf 1",
    # a mixed group the gate keeps (D_K = 1): trajectory 0 wins at step 3, 1 at step 7, 2 and 3 quit at 10
    "early_win": lambda t, s: (
        "win" if s >= {0: 2, 1: 6}.get(t, 99) else ("quit" if s >= 9 else f"go to {t}-{s}")
    ),
}


class Coordinated:
    """The rollout source ``rollout.mode`` selects, wired to the doubles."""

    def __init__(
        self, overrides, fail_games=frozenset(), run_dir=None, bad_games=frozenset(), evaluation=False
    ):
        base = ["rollout.group_size=4", "gate.k=3", "gate.tau=0.12", "rollout.audit_budget=0"]
        if any(o.startswith("gate.name=") for o in overrides):
            base.remove("gate.tau=0.12")  # another gate: its own keys (or defaults)
        cfg = load_config(None, [*base, *overrides])
        if evaluation:  # the held-out evaluator's coordinator, as CoordinatorActor builds it
            cfg = evaluation_config(cfg)
        self.engine = ScriptedEngine(SCRIPTS)
        self.pool = ScriptedEnv(fail_games, bad_games)
        self.c = rollout_source(cfg, [self.engine], self.pool, ScriptedAgent(), run_dir)

    def run(self, games, iteration=0):
        tasks = [folder_task(g, f"task-{i}-{g}", "pick_and_place_simple") for i, g in enumerate(games)]
        return asyncio.run(self.c.rollout(tasks, iteration))


def outcomes(batch):
    return [(r.task_id.split("-", 2)[2], r.outcome) for r in batch.groups]


def test_converged_group_is_cut_at_k_and_freed():
    co = Coordinated(["rollout.strategy=selective", "rollout.groups_per_iteration=1", "rollout.refill=false"])
    batch = co.run(["converge_lose"])
    (record,) = batch.groups
    assert record.outcome is Outcome.CUT
    assert record.gate.step == 3 and record.gate.stop
    assert record.gate.features["prefix_edit_distance"] == 0.0
    # every trajectory got to K = 3 actions and waited there for the decision; none ran to its end
    assert all(len(t.steps) == 3 and t.reward is None for t in record.trajectories)
    assert co.pool.open == set() and len(co.pool.closed) == 4  # episodes closed
    assert sorted(co.engine.released) == sorted(f"{record.group_id}-t{i}" for i in range(4))
    assert not co.engine.in_flight  # nothing left generating
    assert batch.experiences == []  # a cut group never reaches the learner


@pytest.mark.parametrize("hold", [True, False])
def test_a_trajectory_ahead_waits_at_k_for_the_decision_unless_told_not_to(hold):
    """Trajectory 3 is 8x slower than the others: holding at the gate, the fast ones wait at K = 3
    and the cut spends nothing after it; without the hold they run on meanwhile (and the group
    still stops at K, when the slow one gets there)."""
    overrides = ["rollout.strategy=selective", "rollout.groups_per_iteration=1", "rollout.refill=false"]
    co = Coordinated([*overrides, f"rollout.hold_at_gate={str(hold).lower()}"])
    co.engine.slow = {3: 0.08}
    (record,) = co.run(["converge_lose"]).groups
    assert record.outcome is Outcome.CUT and record.gate.step == 3
    lengths = [len(t.steps) for t in record.trajectories]
    if hold:
        assert lengths == [3, 3, 3, 3]
    else:
        assert lengths[3] == 3 and min(lengths[:3]) >= 6  # ~8 steps each while the slow one took 3


def test_in_flight_requests_of_a_cut_group_are_aborted():
    co = Coordinated(
        ["rollout.strategy=selective", "rollout.groups_per_iteration=1", "rollout.refill=false"]
        + ["rollout.hold_at_gate=false"]  # with the hold nothing is in flight when the gate fires
    )
    co.engine.delay = 0.05
    batch = co.run(["converge_lose"])
    # trajectories that had already reached K were generating step K+1 when the gate fired
    assert batch.groups[0].outcome is Outcome.CUT
    assert co.engine.aborted, "the cut group's in-flight requests were not aborted"
    assert all(rid.startswith(batch.groups[0].group_id) for rid in co.engine.aborted)


def test_divergent_group_runs_to_the_end_and_trains():
    co = Coordinated(["rollout.strategy=selective", "rollout.groups_per_iteration=1"])
    batch = co.run(["diverge_mixed"])
    (record,) = batch.groups
    assert record.outcome is Outcome.COMPLETED and not record.gate.stop
    assert [t.reward for t in record.trajectories] == [1.0, 0.0, 1.0, 0.0]
    assert all(len(t.steps) == 7 for t in record.trajectories)
    exps = batch.experiences
    assert len(exps) == 4 and {e.reward for e in exps} == {0.0, 1.0}
    # prompt tokens are masked out, the policy's own tokens are in the loss with their log-probs
    e = exps[0]
    assert e.token_ids[:3] == [1, 1, 2] and e.loss_mask[:3] == [0, 0, 0]
    assert sum(e.loss_mask) == 2 * 7 and e.old_logprobs[3:5] == [-0.5, -0.25]


def test_refill_keeps_the_batch_at_target():
    games = ["converge_lose", "diverge_mixed", "converge_win", "diverge_lose", "diverge_mixed"]
    co = Coordinated(
        ["rollout.strategy=selective", "rollout.groups_per_iteration=2", "rollout.max_groups_in_flight=2"]
    )
    batch = co.run(games)
    kept = [r for r in batch.groups if r.outcome is Outcome.COMPLETED]
    assert len(kept) == 2
    assert sum(r.outcome is Outcome.CUT for r in batch.groups) == 2  # both converged groups cut, replaced
    assert batch.metrics["rollout/groups_cut"] == 2 and batch.metrics["gate/fires"] == 2
    # without refill the paper's protocol just shrinks the batch
    co = Coordinated(["rollout.strategy=selective", "rollout.groups_per_iteration=2", "rollout.refill=false"])
    batch = co.run(games)
    assert [o for _, o in outcomes(batch)] == [Outcome.CUT, Outcome.COMPLETED]


def test_dapo_drops_exactly_the_zero_variance_groups():
    games = ["converge_lose", "diverge_mixed", "converge_win", "diverge_lose", "diverge_mixed"]
    co = Coordinated(
        ["rollout.strategy=dapo", "rollout.groups_per_iteration=2", "rollout.max_groups_in_flight=1"]
    )
    batch = co.run(games)
    assert outcomes(batch) == [
        ("converge_lose", Outcome.FILTERED),
        ("diverge_mixed", Outcome.COMPLETED),
        ("converge_win", Outcome.FILTERED),
        ("diverge_lose", Outcome.FILTERED),
        ("diverge_mixed", Outcome.COMPLETED),
    ]
    assert all(r.gate is None for r in batch.groups)  # dapo never consults the gate
    assert batch.metrics["rollout/zero_var_frac"] == pytest.approx(3 / 5)


def test_none_strategy_trains_on_everything():
    co = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=2"])
    batch = co.run(["converge_lose", "converge_win"])
    assert [o for _, o in outcomes(batch)] == [Outcome.COMPLETED, Outcome.COMPLETED]
    assert len(batch.experiences) == 8 and batch.metrics["rollout/zero_var_frac"] == 1.0


def test_audit_runs_cut_groups_in_shadow_and_measures_precision(tmp_path):
    co = Coordinated(
        ["rollout.strategy=selective", "rollout.groups_per_iteration=1", "rollout.audit_budget=1.0"],
        run_dir=tmp_path,
    )
    batch = co.run(["converge_lose", "converge_win", "diverge_mixed"])
    assert [o for _, o in outcomes(batch)] == [Outcome.AUDITED, Outcome.AUDITED, Outcome.COMPLETED]
    audited = batch.groups[0]
    assert all(t.reward == 0.0 and len(t.steps) == 9 for t in audited.trajectories)  # ran to the end
    assert batch.metrics["gate/audit_precision"] == 1.0 and batch.metrics["gate/audit_n"] == 2
    # both audited groups were zero-variance: the learner gets the kept one only
    assert {e.group_id for e in batch.experiences} == {batch.groups[2].group_id}
    logged = list(read_groups(tmp_path / "rollouts.jsonl"))
    assert [g.outcome for g in logged] == [Outcome.AUDITED, Outcome.AUDITED, Outcome.COMPLETED]


def test_an_audited_false_stop_is_trained_on_and_fills_the_batch(tmp_path):
    """An audited group that ends informative reaches the learner (its tokens are spent anyway) and
    counts toward the iteration's target, so no refill is started for it."""
    co = Coordinated(
        ["rollout.strategy=selective", "rollout.groups_per_iteration=1", "rollout.audit_budget=1.0"],
        run_dir=tmp_path,
    )
    batch = co.run(["converge_mixed", "diverge_mixed"])
    (record,) = batch.groups  # the batch was full after the audit: the second task never started
    assert record.outcome is Outcome.AUDITED and record.zero_variance is False and record.trained_on
    assert {e.group_id for e in batch.experiences} == {record.group_id}
    assert batch.kept_group_ids == [record.group_id]
    assert batch.metrics["rollout/groups_trained"] == 1 and batch.metrics["gate/audit_precision"] == 0.0
    (logged,) = read_groups(tmp_path / "rollouts.jsonl")
    assert logged.outcome is Outcome.AUDITED and logged.trained_on


def test_stalled_gate_cuts_the_group_that_has_not_finished_by_k():
    """stalled at K = 7: no trajectory of converge_lose has ended by then (they quit at step 9), all
    of diverge_mixed's have (step 7), so only the first is cut, whatever their divergence."""
    overrides = ["rollout.strategy=selective", "rollout.groups_per_iteration=3", "rollout.refill=false"]
    co = Coordinated([*overrides, "gate.name=stalled", "gate.k=7"])
    batch = co.run(["converge_lose", "diverge_mixed", "diverge_lose"])
    assert dict(outcomes(batch)) == {
        "converge_lose": Outcome.CUT,
        "diverge_mixed": Outcome.COMPLETED,
        "diverge_lose": Outcome.COMPLETED,
    }
    (cut,) = [g for g in batch.groups if g.outcome is Outcome.CUT]
    assert cut.gate.step == 7 and cut.gate.features["termination_frac"] == 0.0


def test_history_gate_cuts_a_new_task_of_a_type_that_converged(tmp_path):
    """The type prior through the coordinator: three tasks of one type ran to the end all-fail, so
    a fourth, never-seen task of that type is cut at K; with the type prior off it runs on."""
    overrides = ["rollout.strategy=selective", "rollout.groups_per_iteration=3", "rollout.refill=false"]
    history = ["gate.name=history", "gate.tau=0.0", "gate.tau_after_type_zero=0.5", "gate.type_min_known=3"]
    new_task = folder_task("converge_lose", "task-9-converge_lose", "pick_and_place_simple")
    verdicts = {}
    for window in (8, 0):
        co = Coordinated([*overrides, *history, f"gate.type_window={window}"])
        first = co.run(["converge_lose"] * 3)
        assert [o for _, o in outcomes(first)] == [Outcome.COMPLETED] * 3
        (verdicts[window],) = asyncio.run(co.c.rollout([new_task], 1)).groups
    assert verdicts[8].outcome is Outcome.CUT and verdicts[0].outcome is Outcome.COMPLETED
    assert "of pick_and_place_simple groups zero-variance" in verdicts[8].gate.reason


def test_preskip_skips_tasks_seen_zero_variance():
    co = Coordinated(
        ["rollout.strategy=preskip", "rollout.groups_per_iteration=1", "rollout.preskip_explore=0"]
    )
    first = co.run(["converge_lose"])
    assert first.groups[0].zero_variance
    tasks = [
        folder_task("converge_lose", "task-0-converge_lose", "x"),
        folder_task("diverge_mixed", "task-1-diverge_mixed", "x"),
    ]
    second = asyncio.run(co.c.rollout(tasks, 1))
    assert [g.outcome for g in second.groups] == [Outcome.SKIPPED, Outcome.COMPLETED]
    assert second.tasks_consumed == 2


def test_history_gate_learns_from_finished_groups_and_cuts_a_repeat(tmp_path):
    """gate.name=history through the coordinator: the first groups of two tasks run to the end and
    the gate observes them; the next iteration's group of the all-fail task is cut although it is
    as divergent as ever (D_K = 1), while the mixed task's group runs on."""
    overrides = ["rollout.strategy=selective", "rollout.groups_per_iteration=2", "rollout.refill=false"]
    history = ["gate.name=history", "gate.margin=0.0"]
    co = Coordinated([*overrides, *history], run_dir=tmp_path)
    first = co.run(["diverge_lose", "diverge_mixed"])
    assert [o for _, o in outcomes(first)] == [Outcome.COMPLETED, Outcome.COMPLETED]
    assert first.metrics["gate/state/history_tasks"] == 2.0
    second = co.run(["diverge_lose", "diverge_mixed"], iteration=1)
    assert [o for _, o in outcomes(second)] == [Outcome.CUT, Outcome.COMPLETED]
    cut = second.groups[0]
    assert (
        "after a zero-variance group" in cut.gate.reason and cut.gate.features["prefix_edit_distance"] == 1.0
    )
    assert second.metrics["gate/state/history_used_frac"] == 0.5  # of its decisions so far, the second two
    # a resumed run (a new coordinator on the same run folder) relearns the history from the log
    resumed = Coordinated([*overrides, *history], run_dir=tmp_path)
    assert set(resumed.c.gate.known) == {g.task_id for g in first.groups}
    third = resumed.run(["diverge_lose", "diverge_mixed"], iteration=2)
    assert [o for _, o in outcomes(third)] == [Outcome.CUT, Outcome.COMPLETED]
    # a new run primed with that run's log (gate.observe_logs) cuts the repeat in its first
    # iteration; the same new run without it has no history and lets the group run
    primed = Coordinated([*overrides, *history, f"gate.observe_logs=[{tmp_path / 'rollouts.jsonl'}]"])
    assert [o for _, o in outcomes(primed.run(["diverge_lose", "diverge_mixed"]))] == [
        Outcome.CUT,
        Outcome.COMPLETED,
    ]
    fresh = Coordinated([*overrides, *history])
    assert [o for _, o in outcomes(fresh.run(["diverge_lose", "diverge_mixed"]))] == [
        Outcome.COMPLETED,
        Outcome.COMPLETED,
    ]
    # the paper's gate, with no memory, lets the repeat run
    plain = Coordinated(overrides)
    plain.run(["diverge_lose", "diverge_mixed"])
    again = plain.run(["diverge_lose", "diverge_mixed"], iteration=1)
    assert [o for _, o in outcomes(again)] == [Outcome.COMPLETED, Outcome.COMPLETED]


def test_precision_target_gate_reports_its_tau():
    co = Coordinated(
        ["rollout.strategy=selective", "rollout.groups_per_iteration=2", "gate.name=precision_target"]
    )
    batch = co.run(["converge_lose", "diverge_mixed"])
    # no evidence yet: tau starts at 0 and cuts nothing; both finished groups are now known
    assert [o for _, o in outcomes(batch)] == [Outcome.COMPLETED, Outcome.COMPLETED]
    assert batch.metrics["gate/state/tau"] == 0.0 and batch.metrics["gate/state/tau_labelled"] == 2.0


def test_dead_env_worker_fails_only_its_group_and_is_retried():
    co = Coordinated(
        ["rollout.strategy=none", "rollout.groups_per_iteration=2"], fail_games={"diverge_mixed"}
    )
    batch = co.run(["diverge_mixed", "diverge_lose"])
    got = outcomes(batch)
    assert ("diverge_mixed", Outcome.FAILED) in got
    assert got.count(("diverge_mixed", Outcome.COMPLETED)) == 1  # the retry succeeded
    assert ("diverge_lose", Outcome.COMPLETED) in got
    assert batch.metrics["rollout/groups_failed"] == 1


def test_bad_game_fails_once_with_its_path_and_is_skipped_from_then_on(tmp_path):
    co = Coordinated(
        ["rollout.strategy=none", "rollout.groups_per_iteration=2"],
        run_dir=tmp_path,
        bad_games={"converge_lose"},
    )
    first = co.run(["converge_lose", "diverge_mixed", "diverge_lose"])
    assert set(outcomes(first)) == {
        ("converge_lose", Outcome.FAILED),
        ("diverge_mixed", Outcome.COMPLETED),
        ("diverge_lose", Outcome.COMPLETED),
    }
    assert co.pool.resets.count("converge_lose") == 1  # not retried: it would fail the same way
    second = co.run(["converge_lose", "diverge_mixed"], iteration=1)
    assert outcomes(second)[0] == ("converge_lose", Outcome.SKIPPED)
    assert co.pool.resets.count("converge_lose") == 1
    logged = {r.group_id: r for r in read_groups(tmp_path / "rollouts.jsonl")}
    (failed,) = [logged[r.group_id] for r in first.groups if r.outcome is Outcome.FAILED]
    skipped = logged[second.groups[0].group_id]
    assert "bad game converge_lose/game.tw-pddl" in failed.meta["failure"]
    assert "ParseError" in skipped.meta["skipped"]


class OneAtATime(GroupCoordinator):
    """A rollout schedule of a user's own, named by its path: the concurrent one, one group at a time."""

    @property
    def in_flight(self) -> int:
        return 1


@pytest.mark.parametrize(
    "mode, source",
    [
        ("concurrent", GroupCoordinator),
        ("lockstep", LockstepRollout),
        ("tests.rollout.test_coordinator_unit:OneAtATime", OneAtATime),
    ],
)
def test_rollout_mode_selects_the_rollout_source(mode, source):
    co = Coordinated([f"rollout.mode={mode}"])
    assert type(co.c) is source and isinstance(co.c, RolloutSource)


def test_an_unknown_rollout_mode_is_one_config_error():
    from selective_rollout.config import ConfigError, load_config

    with pytest.raises(
        ConfigError, match=r"rollout\.mode: unknown rollout mode 'lockstp' \(did you mean 'lockstep'"
    ):
        load_config(None, ["rollout.mode=lockstp"])


def test_lockstep_mode_matches_the_paper_loop():
    co = Coordinated(
        ["rollout.strategy=selective", "rollout.mode=lockstep", "rollout.groups_per_iteration=2"]
    )
    batch = co.run(["converge_lose", "diverge_mixed", "diverge_lose"])
    assert [o for _, o in outcomes(batch)] == [Outcome.CUT, Outcome.COMPLETED, Outcome.COMPLETED]
    cut = batch.groups[0]
    # in lock-step every trajectory stops at exactly K actions
    assert all(len(t.steps) == 3 for t in cut.trajectories)
    assert not co.engine.aborted
    # each trajectory generates every turn in its own KV session (prefix reuse, as the paper's
    # vLLM with prefix caching), never from scratch
    sessions = co.engine.sessions
    assert sessions and None not in sessions.values()
    assert all(session == request.rsplit("-s", 1)[0] for request, session in sessions.items())


def test_lockstep_issues_one_engine_round_and_one_env_step_per_turn():
    """The faithful reference (issue 15): each turn, every live trajectory's request is in the
    engine at once (one round, all G in flight together), then one batched env step of all G
    actions; the next round starts only after that step."""
    co = Coordinated(["rollout.strategy=none", "rollout.mode=lockstep", "rollout.groups_per_iteration=1"])
    events: list[tuple[str, int]] = []
    in_flight = [0]
    generate, step = co.engine._generate, co.pool.step

    async def logged_generate(request_id, *args, **kwargs):
        in_flight[0] += 1
        events.append(("in flight", in_flight[0]))
        try:
            return await generate(request_id, *args, **kwargs)
        finally:
            in_flight[0] -= 1

    async def logged_step(actions):
        events.append(("env step", len(actions)))
        return await step(actions)

    co.engine.generate = _Remote(logged_generate)
    co.pool.step = logged_step
    batch = co.run(["diverge_lose"])
    assert [o for _, o in outcomes(batch)] == [Outcome.COMPLETED]
    turns = len(batch.groups[0].trajectories[0].steps)
    assert turns == 7  # the script quits at step 6
    one_turn = [("in flight", 1), ("in flight", 2), ("in flight", 3), ("in flight", 4), ("env step", 4)]
    assert events == one_turn * turns


def test_evaluation_plays_one_greedy_task_at_a_time():
    """Held-out evaluation decodes each episode alone in the engine (``eval.max_in_flight`` 1),
    so which requests share a bf16 forward never changes a greedy choice: the same weights score
    the same in every arm; training rollouts keep their concurrency."""
    co = Coordinated(["eval.num_tasks=3", "rollout.max_groups_in_flight=4"], evaluation=True)
    in_flight, most = [0], [0]
    generate = co.engine._generate

    async def counted(*args, **kwargs):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        try:
            return await generate(*args, **kwargs)
        finally:
            in_flight[0] -= 1

    co.engine.generate = _Remote(counted)
    batch = co.run(["diverge_mixed", "converge_win", "diverge_lose"], iteration=-1)
    assert [o for _, o in outcomes(batch)] == [Outcome.COMPLETED] * 3
    assert all(len(g.trajectories) == 1 for g in batch.groups)  # eval.tries
    assert most[0] == 1 and co.c.cfg.engine.temperature == 0  # one episode at a time, greedy
    training = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=3"])
    training.engine.generate = _Remote(counted)
    most[0] = 0
    training.run(["diverge_mixed", "converge_win", "diverge_lose"])
    assert most[0] > 4  # three groups of four in flight together


def test_sampling_seeds_follow_the_task_not_the_schedule():
    """A trajectory's sampling seed is fixed by (run seed, iteration, task, trajectory, step): two
    coordinators that start the groups in another order and with other group ids seed alike."""
    games = ["diverge_mixed", "diverge_lose"]
    alone = Coordinated(
        ["rollout.strategy=none", "rollout.groups_per_iteration=2", "rollout.max_groups_in_flight=1"]
    )
    alone.c._group_seq = 40  # other group ids
    alone.run(games)
    together = Coordinated(
        ["rollout.strategy=none", "rollout.groups_per_iteration=2", "rollout.max_groups_in_flight=2"]
    )
    together.run(games)
    assert alone.engine.seeds == together.engine.seeds and len(set(alone.engine.seeds.values())) > 10
    other_iteration = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=2"])
    other_iteration.run(games, iteration=1)
    assert set(other_iteration.engine.seeds.values()).isdisjoint(alone.engine.seeds.values())


class DyingEngine(ScriptedEngine):
    """Dies (Ray's ActorDiedError) on its first request, or fails it (RayTaskError) and lives."""

    def __init__(self, error):
        super().__init__(SCRIPTS)
        self.error, self.calls = error, 0
        self.generate = _Remote(self._maybe_fail)

    async def _maybe_fail(self, request_id, prompt, sampling, session_id=None):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        return await self._generate(request_id, prompt, sampling, session_id)


def test_an_engine_error_fails_the_group_but_keeps_the_engine():
    from ray.exceptions import RayTaskError

    co = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=1"])
    co.c.replace_engine(0, DyingEngine(RayTaskError("generate", "tb", ValueError("bad request"))))
    batch = co.run(["diverge_mixed"])
    assert [g.outcome for g in batch.groups] == [Outcome.FAILED, Outcome.COMPLETED]  # retried, same engine
    assert co.c.dead_engines() == []


class DroppingEngine(ScriptedEngine):
    """Ends its first request as aborted although nobody asked (an engine that dropped it)."""

    def __init__(self):
        super().__init__(SCRIPTS)
        self.calls = 0
        self.generate = _Remote(self._drop_first)

    async def _drop_first(self, request_id, prompt, sampling, session_id=None):
        self.calls += 1
        if self.calls == 1:
            return Completion(request_id, len(prompt), 0, [CompletionOutput(0, [], [], "", "abort")])
        return await self._generate(request_id, prompt, sampling, session_id)


def test_an_abort_nobody_asked_for_fails_the_group():
    """Only a cut aborts a request: a dropped one leaves its trajectory without a next step, so the
    group fails and is retried instead of being trained on with a trajectory cut short."""
    co = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=1"])
    co.c.replace_engine(0, DroppingEngine())
    batch = co.run(["diverge_mixed"])
    assert [g.outcome for g in batch.groups] == [Outcome.FAILED, Outcome.COMPLETED]
    assert "aborted it0-g1-t" in batch.groups[0].meta["failure"]


def test_with_its_only_engine_dead_the_rollout_waits_for_the_replacement():
    from ray.exceptions import ActorDiedError

    co = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=1"])
    co.c.replace_engine(0, DyingEngine(ActorDiedError()))
    tasks = [folder_task("diverge_mixed", "task-0-diverge_mixed", "x")]

    async def scenario():
        rollout = asyncio.create_task(co.c.rollout(tasks, 0))
        while not co.c.dead_engines():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the rollout is now waiting, not failing
        assert not rollout.done()
        co.c.replace_engine(0, ScriptedEngine(SCRIPTS))  # what the driver does
        return await asyncio.wait_for(rollout, 30)

    batch = asyncio.run(scenario())
    assert [g.outcome for g in batch.groups] == [Outcome.FAILED, Outcome.COMPLETED]
    assert "engine 0 died" in batch.groups[0].meta["failure"] and co.c.dead_engines() == []


def test_no_replacement_within_the_timeout_is_one_clear_error():
    from ray.exceptions import ActorDiedError

    co = Coordinated(["rollout.strategy=none", "rollout.engine_replace_timeout_s=0.3"])
    co.c.replace_engine(0, DyingEngine(ActorDiedError()))
    with pytest.raises(
        RuntimeError, match=r"none was replaced within 0 s \(rollout\.engine_replace_timeout_s\)"
    ):
        co.run(["diverge_mixed"])


OUTLIVED = ["trajectory_stop.name=outlived", "trajectory_stop.min_step=3", "rollout.groups_per_iteration=1"]


@pytest.mark.parametrize("mode", ["lockstep", "concurrent"])
def test_outlived_stops_the_wanderers_of_a_kept_group_once_a_sibling_has_won(tmp_path, mode):
    """Trajectory 0 wins at step 3 of a group the gate kept at step 2: the rule ends the other three
    at once with reward 0 (status stopped, the steps they took and no more), the group trains on
    those rewards, and the log and the metrics say so."""
    gated = ["rollout.strategy=selective", "gate.k=2", f"rollout.mode={mode}"]
    co = Coordinated([*OUTLIVED, *gated], run_dir=tmp_path)
    batch = co.run(["early_win"])
    (record,) = batch.groups
    assert record.outcome is Outcome.COMPLETED and (record.gate.step, record.gate.stop) == (2, False)
    winner, *stopped = record.trajectories
    assert winner.status is TrajectoryStatus.FINISHED and winner.reward == 1.0 and winner.stop is None
    for t in stopped:
        assert t.status is TrajectoryStatus.STOPPED and t.reward == 0.0 and not t.won
        assert t.stop.rule == "outlived" and t.stop.assigned == 0.0 and not t.stop.audited
        assert len(t.steps) == t.stop.step
        # in lock-step the winner's step 3 comes first in its round; at their own pace the others may
        # be a step or two further when the winner's third step lands
        assert t.stop.step == 3 if mode == "lockstep" else 3 <= t.stop.step <= 5
    assert list(read_groups(tmp_path / "rollouts.jsonl")) == [record]
    rewards = {e.trajectory: e.reward for e in batch.experiences}
    assert rewards == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}  # the stopped ones train with the assigned reward
    policy = {e.trajectory: sum(e.loss_mask) for e in batch.experiences}
    assert all(policy[t.index] == 2 * len(t.steps) for t in record.trajectories)  # the tokens they made
    assert not co.engine.in_flight and co.pool.open == set()
    cap = co.c.rc.max_steps
    assert batch.metrics["trajectory_stop/stopped"] == 3 and batch.metrics["trajectory_stop/audited"] == 0
    assert batch.metrics["trajectory_stop/step_tokens_saved_est"] == sum(
        (cap - t.stop.step) * t.steps[-1].step_tokens for t in stopped
    )
    assert "trajectory_stop/label_precision" not in batch.metrics


def test_audited_trajectory_stops_run_on_and_record_their_labels(tmp_path):
    """With the whole budget every stop is audited: the trajectories play to their end, their true
    rewards are the record's, and each stop's label is measured (trajectory 1 wins later: wrong)."""
    co = Coordinated([*OUTLIVED, "rollout.strategy=none", "rollout.audit_budget=1.0"], run_dir=tmp_path)
    batch = co.run(["early_win"])
    (record,) = list(read_groups(tmp_path / "rollouts.jsonl"))
    assert record.outcome is Outcome.COMPLETED
    assert [t.reward for t in record.trajectories] == [1.0, 1.0, 0.0, 0.0]
    assert [len(t.steps) for t in record.trajectories] == [3, 7, 10, 10]
    assert [t.status for t in record.trajectories] == [TrajectoryStatus.FINISHED] * 4
    assert all(t.stop.audited and t.stop.assigned == 0.0 for t in record.trajectories[1:])
    assert [t.label_right for t in record.trajectories] == [None, False, True, True]
    assert batch.metrics["trajectory_stop/audited"] == 3 and batch.metrics["trajectory_stop/stopped"] == 0
    assert batch.metrics["trajectory_stop/label_precision"] == pytest.approx(2 / 3)
    assert {e.reward for e in batch.experiences if e.trajectory == 1} == {1.0}  # trained on its true reward
    audits = co.c.stop_audits
    assert (audits.audited, audits.right, audits.in_flight) == (3, 2, 0)
    after_stop = sum(sum(t.step_tokens[t.stop.step :]) for t in record.trajectories[1:])
    assert audits.audit_spent == after_stop and co.c.audits.charged == after_stop  # paid from the one budget


def test_a_small_budget_audits_the_first_trajectory_stop_and_stops_the_rest():
    """The run's first stop is audited; before any trajectory has finished the budget cannot price
    another audit, so the group's other stops end their trajectories."""
    co = Coordinated(
        [*OUTLIVED, "rollout.strategy=none", "rollout.mode=lockstep", "rollout.audit_budget=0.05"]
    )
    (record,) = co.run(["early_win"]).groups
    assert [t.status for t in record.trajectories] == [
        TrajectoryStatus.FINISHED,
        TrajectoryStatus.FINISHED,  # audited: ran on, and won at step 7
        TrajectoryStatus.STOPPED,
        TrajectoryStatus.STOPPED,
    ]
    assert record.trajectories[1].stop.audited and record.trajectories[1].label_right is False
    assert [t.reward for t in record.trajectories] == [1.0, 1.0, 0.0, 0.0]


def test_no_rule_leaves_every_trajectory_running_and_reports_no_stop_metrics():
    co = Coordinated(["rollout.strategy=none", "rollout.groups_per_iteration=1"])
    batch = co.run(["early_win"])
    assert [len(t.steps) for t in batch.groups[0].trajectories] == [3, 7, 10, 10]
    assert all(t.stop is None for t in batch.groups[0].trajectories)
    assert not any(key.startswith("trajectory_stop/") for key in batch.metrics)


def test_the_held_out_evaluation_never_stops_a_trajectory():
    co = Coordinated([*OUTLIVED, "eval.tries=4", "eval.num_tasks=1"], evaluation=True)
    (record,) = co.run(["early_win"], iteration=-1).groups
    assert co.c.cfg.trajectory_stop.name == "none"
    assert [len(t.steps) for t in record.trajectories] == [3, 7, 10, 10]
