"""The composed gate: any member, each at its own step, with both halves of the waste counted."""

from __future__ import annotations

import pytest

from selective_rollout.analysis.gate_eval.replay import ReplayCalibration, replay, summarize
from selective_rollout.config import ConfigError, dump_config, load_config
from selective_rollout.gate import GroupView, build_gate
from selective_rollout.gate.any_of import AnyGate
from tests.gate.synthetic import converged, divergent, group

LONG = [f"a{s}" for s in range(10)]
MEMBERS = [{"name": "stalled", "k": 6}, {"name": "prefix_edit", "k": 3, "tau": 0.2}]


def _log() -> list:
    """Wandering all-fail groups (diverse, 10 steps), early-converging all-succeed groups that
    finish at step 5, and mixed groups (diverse; one trajectory wins at step 4)."""
    fails = [divergent(f"f{i}", [0] * 4) for i in range(6)]
    succeeds = [converged(f"s{i}", [1] * 4, length=5) for i in range(4)]
    mixed = [
        group(
            f"m{i}",
            [[f"w{i}-{s}" for s in range(4)], *[[f"t{j}-{s}" for s in range(10)] for j in range(3)]],
            [1, 0, 0, 0],
        )
        for i in range(4)
    ]
    return fails + succeeds + mixed


def test_each_member_is_asked_at_its_own_steps_and_the_first_stop_wins() -> None:
    gate = build_gate("any", members=MEMBERS)
    assert gate.k == 3 and gate.decision_steps == [3, 6]
    assert gate.should_check(3) and gate.should_check(6) and not gate.should_check(4)
    converged_at_3 = gate.decide(GroupView([LONG[:3]] * 4, step=3, ended=[False] * 4))
    assert converged_at_3.stop and converged_at_3.reason.startswith("prefix_edit:")
    wandering = [[f"t{i}-{s}" for s in range(6)] for i in range(4)]
    at_3 = gate.decide(GroupView([a[:3] for a in wandering], step=3, ended=[False] * 4))
    assert not at_3.stop and "prefix_edit" in at_3.reason and "stalled" not in at_3.reason
    at_6 = gate.decide(GroupView(wandering, step=6, ended=[False] * 4))
    assert at_6.stop and at_6.reason.startswith("stalled:")


def test_it_catches_both_classes_where_each_member_catches_one() -> None:
    log = _log()
    both = summarize(replay(build_gate("any", members=MEMBERS), log))
    stalled = summarize(replay(build_gate(**MEMBERS[0]), log))
    dk = summarize(replay(build_gate(**MEMBERS[1]), log))
    # all-succeed groups end at step 5, before stalled's step 6: it could never cut them
    assert stalled["recall_all_fail"] == 1.0 and stalled["all_succeed_live"] == 0
    assert dk["recall_all_fail"] == 0.0 and dk["recall_all_succeed"] == 1.0
    assert both["recall_all_fail"] == 1.0 and both["recall_all_succeed"] == 1.0
    assert both["precision"] == 1.0 and both["saved"] > max(stalled["saved"], dk["saved"])


def test_members_observe_every_group_and_report_under_their_names() -> None:
    members = [{"name": "stalled", "k": 8, "online": [4, 9]}, {"name": "precision_target", "k": 3}]
    gate = build_gate("any", members=members)
    for record in [divergent(f"f{i}", [0] * 4) for i in range(40)]:
        gate.observe(record)
    m = gate.metrics()
    assert m["stalled_step"] == 4 and m["precision_target_tau_labelled"] == 40
    assert gate.decision_steps == [3, 4]  # the stalled member's step moved online
    twins = build_gate("any", members=[{"name": "prefix_edit", "k": 3}, {"name": "prefix_edit", "k": 5}])
    assert twins.labels == ["prefix_edit0", "prefix_edit1"]


def test_calibration_tunes_each_member_and_keeps_the_union_at_the_target() -> None:
    late = [[f"w-{s}" for s in range(9)], *[[f"t{j}-{s}" for s in range(10)] for j in range(3)]]
    log = _log() + [group(f"late{i}", late, [1, 0, 0, 0]) for i in range(3)]
    cal = ReplayCalibration(0.9, shared={"k": 3, "mode": "at_k", "steps": []})
    params = AnyGate.calibrate(log, cal)
    stalled, dk = params["members"]
    assert stalled["name"] == "stalled" and stalled["k"] >= 9  # the late winners push its step past 8
    assert dk["name"] == "prefix_edit" and dk["tau"] > 0
    assert cal.score(build_gate("any", k=3, **params), log)["precision"] >= 0.9


def test_the_run_config_takes_the_gate_and_says_which_member_is_wrong(tmp_path) -> None:
    cfg = load_config("configs/cpu_default.yaml", ["gate.name=any"])
    assert cfg.gate.k == 4  # its earliest member's step, whatever the profile's k was
    assert cfg.gate.build().decision_steps == [4, 11]
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again.gate.build().members == cfg.gate.build().members
    with pytest.raises(ConfigError, match=r"members\[1\]: unknown gate 'stalld' \(did you mean 'stalled'"):
        load_config(
            "configs/cpu_default.yaml", ["gate.name=any", "gate.members=[{name: none}, {name: stalld}]"]
        )
    with pytest.raises(ConfigError, match=r"members\[0\] \(stalled\) has no parameter 'tau'"):
        load_config("configs/cpu_default.yaml", ["gate.name=any", "gate.members=[{name: stalled, tau: 1}]"])
    with pytest.raises(ConfigError, match="offline only"):
        load_config("configs/cpu_default.yaml", ["gate.name=any", "gate.members=[{name: oracle}]"])
