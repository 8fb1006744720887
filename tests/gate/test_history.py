"""The history gate: its decision depends on the task's earlier groups, and only on known outcomes."""

from __future__ import annotations

import pytest

from selective_rollout.analysis.gate_eval.replay import ReplayCalibration, as_recorded, replay, summarize
from selective_rollout.gate import GroupView, build_gate
from selective_rollout.records import GateRecord
from tests.gate.synthetic import converged, divergent, mixed_log, partly, typed_log

# D_3 = 1/3 for this group state (two of three actions shared by all)
STATE = [[f"a{s}" if s < 2 else f"t{i}-a{s}" for s in range(3)] for i in range(4)]


def _state(task: str | None = "t", task_type: str | None = "pick") -> GroupView:
    return GroupView(STATE, step=3, task_id=task, task_type=task_type)


def _gate(**kw):
    defaults = {
        "tau": 0.1,
        "tau_after_zero": 0.5,
        "margin": -1.0,
        "type_min_known": 3,
        "type_zero_share": 0.9,
    }
    return build_gate("history", k=3, **{**defaults, **kw})


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
    cal = ReplayCalibration(target=0.9, shared={"k": 4})
    params = type(_gate()).calibrate(log, cal)
    plain = summarize(replay(build_gate("prefix_edit", k=4, tau=params["tau"]), log))
    hist = summarize(replay(build_gate("history", k=4, **params), log))
    assert hist["precision"] >= 0.9 and hist["saved"] > plain["saved"]


def test_a_new_task_is_cut_when_its_type_mostly_converged_and_not_before() -> None:
    """Type prior: three zero-variance groups of other 'pick' tasks make a never-seen 'pick' task
    cut at D = 1/3 < tau_after_type_zero; two are not enough; a 'cool' task, a runner without
    types, or the prior turned off keep the plain rule (1/3 >= tau)."""
    gate, off = _gate(tau_after_type_zero=0.5), _gate(tau_after_type_zero=0.5, type_window=0)
    for n in range(3):
        assert not gate.decide(_state()).stop  # fewer than type_min_known known groups of the type
        for g in (gate, off):
            g.observe(divergent(f"other-{n}", [1] * 4))  # all-succeed, of type 'pick'
    d = gate.decide(_state())
    assert d.stop and d.features["type_zero_share"] == 1.0
    assert not off.decide(_state()).stop
    assert not gate.decide(_state(task_type="cool")).stop
    assert not gate.decide(_state(task_type=None)).stop
    assert gate.metrics()["history_type_used_frac"] > 0


def test_the_type_prior_follows_the_share_in_its_window_and_yields_to_the_tasks_own_history() -> None:
    gate = _gate(tau_after_type_zero=0.5, type_window=4, type_zero_share=0.75)
    for n in range(4):
        gate.observe(divergent(f"other-{n}", [0] * 4))
    assert gate.decide(_state()).stop
    gate.observe(divergent("other-4", [1, 0, 0, 0]))  # 3 of the last 4 zero-variance: 0.75 still holds
    assert gate.decide(_state()).stop
    gate.observe(divergent("other-5", [1, 0, 0, 0]))  # 2 of 4: the prior no longer holds
    assert not gate.decide(_state()).stop
    for n in range(6, 10):
        gate.observe(divergent(f"other-{n}", [0] * 4))
    gate.observe(divergent("t", [1, 0, 1, 0]))  # the task's own last group was mixed: that decides
    assert not gate.decide(_state()).stop
    cut = as_recorded(converged("x", [0] * 4), GateRecord(step=3, stop=True, reason="", features={}), False)
    before = list(gate.by_type["pick"])
    gate.observe(cut)  # a cut group's outcome is unknown: the type learns nothing from it
    assert list(gate.by_type["pick"]) == before


def test_calibration_finds_the_type_prior_where_no_task_repeats() -> None:
    """Calibrated on one log and replayed on another where every task is new: only the type
    prior can stop, and it stops the mastered and lost types' groups, not the mixed type's."""
    fit, held_out = typed_log(seed=0), typed_log(seed=1)
    cal = ReplayCalibration(target=0.9, shared={"k": 4})
    params = type(_gate()).calibrate(fit, cal)
    assert params["type_window"] > 0
    gate = build_gate("history", k=4, **params)
    for record in fit:
        gate.observe(record)
    out = summarize(replay(gate, held_out))
    without = summarize(replay(build_gate("history", k=4, **{**params, "type_window": 0}), held_out))
    assert out["precision"] >= 0.9 and out["recall"] > 0.4  # every 5th prior stop runs on (recheck)
    assert out["saved"] > 0 and without["saved"] == 0


def test_every_nth_stop_only_the_history_made_runs_on_and_plain_stops_never_do() -> None:
    gate = _gate(tau_after_type_zero=0.5, recheck_every=3)
    for n in range(3):
        gate.observe(divergent(f"other-{n}", [0] * 4))
    verdicts = [gate.decide(_state(task=f"new-{n}")) for n in range(6)]
    assert [v.stop for v in verdicts] == [True, True, False, True, True, False]
    assert "rechecked" in verdicts[2].reason and gate.metrics()["history_rechecks"] == 2.0
    plain = _gate(tau=0.5, recheck_every=1)  # D = 1/3 < tau: the plain rule stops, nothing to recheck
    assert all(plain.decide(_state(task=f"new-{n}")).stop for n in range(3))
    never = _gate(tau_after_type_zero=0.5, recheck_every=0)
    for n in range(3):
        never.observe(divergent(f"other-{n}", [0] * 4))
    assert all(never.decide(_state(task=f"new-{n}")).stop for n in range(6))


def test_a_type_window_too_small_for_its_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="type prior could never count"):
        build_gate("history", k=3, type_window=4, type_min_known=5)
    build_gate("history", k=3, type_window=0, type_min_known=5)  # the prior off: nothing to check
