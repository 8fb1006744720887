"""The history gate: its decision depends on the task's earlier groups, and only on known outcomes."""

from __future__ import annotations

from selective_rollout.gate import GroupState, build_gate
from selective_rollout.gate.replay import Calibration, as_recorded, replay, summarize
from selective_rollout.records import GateRecord
from tests.gate.synthetic import converged, divergent, mixed_log, partly

# D_3 = 1/3 for this group state (two of three actions shared by all)
STATE = [[f"a{s}" if s < 2 else f"t{i}-a{s}" for s in range(3)] for i in range(4)]


def _state(task: str | None = "t") -> GroupState:
    return GroupState(STATE, step=3, task_id=task)


def _gate(**kw):
    return build_gate("history", k=3, **{"tau": 0.1, "tau_after_zero": 0.5, "margin": -1.0, **kw})


def test_the_same_group_is_cut_after_a_zero_variance_group_of_its_task_only() -> None:
    gate = _gate()
    assert not gate.decide(_state()).stop  # no history: the plain rule, D = 1/3 >= 0.1
    gate.observe(divergent("other", [0] * 4))  # another task's history does not count
    assert not gate.decide(_state()).stop
    gate.observe(divergent("t", [0] * 4))  # this task was all-fail (and divergent) last time
    d = gate.decide(_state())
    assert d.stop and d.features["history_zero_variance"] == 1.0
    gate.observe(divergent("t", [1, 0, 0, 0]))  # then mixed: the latest known group decides
    assert not gate.decide(_state()).stop
    assert not gate.decide(_state(task=None)).stop  # a runner without task ids: the plain gate


def test_a_cut_group_adds_no_history() -> None:
    gate = _gate()
    g = converged("t", [0] * 4)
    cut = as_recorded(g, GateRecord(step=3, stop=True, reason="", features={}), audited=False)
    gate.observe(cut)
    assert gate.known == {} and not gate.decide(_state()).stop
    gate.observe(as_recorded(g, GateRecord(step=3, stop=True, reason="", features={}), audited=True))
    assert gate.decide(_state()).stop  # an audited one does: its outcome is known


def test_margin_compares_with_the_distance_then() -> None:
    gate = _gate(tau_after_zero=0.0, margin=0.05)
    gate.observe(partly("t", [0] * 4, shared=1))  # D_3 then: 2/3
    assert gate.decide(_state()).stop  # 1/3 <= 2/3 + 0.05
    gate.observe(partly("t", [0] * 4, shared=3))  # D_3 then: 0
    assert not gate.decide(_state()).stop  # 1/3 > 0 + 0.05


def test_after_a_mixed_group_its_own_threshold() -> None:
    gate = _gate(tau=0.5, tau_after_mixed=0.0)
    assert gate.decide(_state()).stop  # no history: 1/3 < 0.5
    gate.observe(divergent("t", [1, 0, 1, 0]))
    assert not gate.decide(_state()).stop
    assert gate.metrics()["history_tasks"] == 1.0


def test_replay_only_shows_earlier_groups() -> None:
    """Two groups of one task: the first is decided with no history, the second with the first's."""
    first, second = partly("t", [0] * 4, shared=1), partly("t", [0] * 4, shared=1)  # D_3 = 2/3
    out = replay(_gate(tau_after_zero=0.9), [first, second])
    assert [o.stopped for o in out] == [False, True]


def test_calibration_beats_the_plain_gate_on_a_log_with_repeating_tasks() -> None:
    log = mixed_log(seed=0, tasks=40, reps=3)
    cal = Calibration(target=0.9, shared={"k": 4})
    params = type(_gate()).calibrate(log, cal)
    plain = summarize(replay(build_gate("prefix_edit", k=4, tau=params["tau"]), log))
    hist = summarize(replay(build_gate("history", k=4, **params), log))
    assert hist["precision"] >= 0.9 and hist["saved"] > plain["saved"]
