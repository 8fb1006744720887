"""Replaying logged groups through a gate as a run meets them: truncation, audits, what it observes."""

from __future__ import annotations

import json
import math

import pytest

from selective_rollout.analysis.gate_eval.evaluate import EPS as EVALUATE_EPS
from selective_rollout.analysis.gate_eval.evaluate import labelled_groups
from selective_rollout.analysis.gate_eval.replay import EPS, ReplayCalibration, replay, summarize
from selective_rollout.gate import GateDecision, GroupView, PrefixEditGate, build_gate
from selective_rollout.gate.calibration import best_params
from selective_rollout.gate.snapshot import caching, tokens_after
from selective_rollout.records import Outcome
from selective_rollout.stats import grpo_advantages
from tests.gate.synthetic import converged, divergent, group, partly


class SpyGate(PrefixEditGate):
    """The paper's gate, keeping what it was shown and what it was told."""

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.shown: list[GroupView] = []
        self.told = []

    def decide(self, group: GroupView) -> GateDecision:
        self.shown.append(group)
        return super().decide(group)

    def observe(self, record) -> None:
        self.told.append(record)


def test_the_gate_sees_only_the_first_k_actions_and_the_task() -> None:
    gate = SpyGate(k=3, tau=0.5, steps=[5])
    replay(gate, [divergent("t1", [1, 0, 0, 0], length=8), converged("t2", [0] * 4, length=2)])
    # the divergent group is asked at 3 and 5 (never stops); the converged one ended before K: never asked
    assert [(s.step, s.task_id) for s in gate.shown] == [(3, "t1"), (5, "t1")]
    for state in gate.shown:
        assert all(len(a) == state.step for a in state.actions) and not any(state.ended)
        assert state.final_rewards is None  # only the oracle is shown the outcome


def test_a_cut_group_is_observed_without_its_outcome_an_uncut_one_with_it() -> None:
    gate = SpyGate(k=3, tau=0.5)
    out = replay(gate, [converged("t1", [0] * 4), divergent("t2", [1, 0, 1, 0])])
    cut, kept = gate.told
    assert cut.outcome is Outcome.CUT and cut.zero_variance is None
    assert all(len(t.steps) == 3 and t.reward is None for t in cut.trajectories)
    assert cut.gate.step == 3 and cut.gate.stop
    assert kept.outcome is Outcome.COMPLETED and kept.zero_variance is False and not kept.gate.stop
    # the cut saves the 7 steps x 4 trajectories after K; the oracle saves the same on this group
    assert out[0].saved == 7 * 4 * 100 and out[0].oracle == out[0].saved and out[1].saved == 0


def test_audited_stops_run_on_save_nothing_and_count_for_precision() -> None:
    gate = SpyGate(k=3, tau=0.5)
    groups = [converged("t1", [0] * 4), partly("t2", [1, 0, 0, 0], shared=5), converged("t3", [1] * 4)]
    out = replay(gate, groups, audit_budget=1.0, audit_target=0.99)
    assert [o.audited for o in out] == [True, True, True]  # budget 1: audit every stop
    assert [r.outcome for r in gate.told] == [Outcome.AUDITED] * 3
    assert gate.told[1].zero_variance is False  # an audit reveals the outcome
    s = summarize(out)
    assert (s["stops"], s["audited"], s["saved"]) == (3, 3, 0.0)
    assert s["precision"] == pytest.approx(2 / 3)
    plain = summarize(replay(SpyGate(k=3, tau=0.5), groups))
    # unaudited, all three are cut at K=3 of 10 steps: 70% saved, 1.5x the oracle (which spares the mixed one)
    assert plain["saved"] == pytest.approx(0.7) and plain["share_of_oracle"] == pytest.approx(1.5)


def test_multi_step_gates_can_cut_a_group_that_was_diverse_at_k() -> None:
    # the trajectories part ways for 3 steps, then walk the same path: D_3 = 1, D_9 = 3/9
    late = group("t", [[f"t{i}-a{s}" if s < 3 else f"a{s}" for s in range(12)] for i in range(4)], [0] * 4)
    once = summarize(replay(build_gate("prefix_edit", k=3, tau=0.5), [late]))
    later = summarize(replay(build_gate("prefix_edit", k=3, tau=0.5, steps=[6, 9]), [late]))
    assert once["stops"] == 0 and later["stops"] == 1
    assert later["saved"] == pytest.approx(3 / 12)  # cut at step 9 of 12


def test_the_loosest_threshold_meeting_the_target_is_chosen() -> None:
    # D_3: 0 (zero-var), 1/3 (zero-var), 2/3 (mixed), 1 (mixed)
    fit = [
        converged("a", [0] * 4),
        partly("b", [1] * 4, shared=2, length=10),
        partly("c", [1, 0, 0, 0], shared=1, length=10),
        divergent("d", [1, 0, 1, 0]),
    ]
    cal = ReplayCalibration(target=0.9, shared={"k": 3})
    params, summary = best_params("prefix_edit", [{"tau": t} for t in cal.thresholds], fit, cal)
    assert summary["precision"] == 1.0 and summary["stops"] == 2
    assert 0.34 <= params["tau"] <= 0.67  # anything between D of b and D of c; the most saving: first listed
    with pytest.raises(ValueError, match="no candidate"):
        best_params("prefix_edit", [{"tau": 1.0}], fit, cal)


def test_advantage_l2_uses_the_trainers_formula() -> None:
    from selective_rollout.learner.advantages import compute_advantages
    from selective_rollout.learner.losses.advantage import GRPO
    from selective_rollout.records import Experience

    assert EPS == EVALUATE_EPS == GRPO.model_fields["advantage_eps"].default
    rewards = [1.0, 0.0, 0.0, 0.0]
    batch = [Experience("g", "t", "pick", [1], [1], [0.0], r, trajectory=i) for i, r in enumerate(rewards)]
    trainer = compute_advantages(batch, GRPO(advantage_eps=EPS))
    # the sample std (ddof=1), not the population one: sum of squares = n - 1 (up to eps)
    assert sum(a * a for a in trainer) == pytest.approx(3.0, rel=1e-4)
    assert grpo_advantages(rewards, EPS).tolist() == pytest.approx(trainer)
    (offline,) = labelled_groups([divergent("t", rewards)])
    assert offline.advantage_sq() == pytest.approx(sum(a * a for a in trainer))
    (o,) = replay(build_gate("none"), [divergent("t", rewards)])
    assert o.adv_sq == pytest.approx(offline.advantage_sq())


def test_caching_changes_nothing() -> None:
    groups = [converged("a", [0] * 4), partly("b", [1, 0, 0, 0], shared=4), divergent("c", [1] * 4)]
    plain = summarize(replay(build_gate("prefix_edit", k=3, tau=0.4), groups))
    with caching():
        first = summarize(replay(build_gate("prefix_edit", k=3, tau=0.4), groups))
        again = summarize(replay(build_gate("prefix_edit", k=3, tau=0.4), groups))
    assert json.dumps(plain) == json.dumps(first) == json.dumps(again)  # NaN-aware
    assert math.isnan(plain["per_informative"])  # the one informative group was cut: not defined


def test_per_informative_weighs_what_cuts_save_against_informative_groups_lost() -> None:
    """Groups of 4 x 10 steps x 100 step-tokens; the gate cuts every group alike at K = 3 and so
    saves 2800 of each group it cuts: with no informative group lost, per informative group it spends
    the share it did not save; a false cut halves the informative groups and costs more than it saves."""
    gate = {"k": 3, "tau": 0.4}
    zero, mixed = converged("a", [0] * 4), divergent("b", [1, 0, 0, 0])
    alike_but_mixed = partly("c", [0, 1, 1, 0], shared=4)  # D_3 = 0, yet informative
    pays = summarize(replay(build_gate("prefix_edit", **gate), [zero, mixed]))
    assert pays["per_informative"] == pytest.approx(5200 / 8000 - 1)  # -35%
    costs = summarize(replay(build_gate("prefix_edit", **gate), [zero, mixed, alike_but_mixed]))
    assert costs["per_informative"] == pytest.approx((12000 - 5600) / 12000 * 2 / 1 - 1)  # +6.7%
    assert math.isnan(
        summarize(replay(build_gate("prefix_edit", **gate), [zero, alike_but_mixed]))["per_informative"]
    )


def test_an_audited_false_stop_keeps_its_advantages_a_cut_one_loses_them() -> None:
    """As the coordinator trains on audited groups that end informative."""
    alike_but_mixed = partly("c", [0, 1, 1, 0], shared=4)
    cut = summarize(replay(build_gate("prefix_edit", k=3, tau=0.4), [alike_but_mixed]))
    audited = summarize(replay(build_gate("prefix_edit", k=3, tau=0.4), [alike_but_mixed], audit_budget=1.0))
    assert cut["audited"] == 0 and cut["adv_l2_preserved"] == 0.0
    assert (
        audited["audited"] == 1 and audited["adv_l2_preserved"] == 1.0 and audited["per_informative"] == 0.0
    )


def test_recall_is_counted_per_class_over_the_groups_still_running_at_the_gates_step():
    """All-fail and all-succeed groups are two halves of the waste; a group whose trajectories all
    ended before the gate's step cannot be cut and is counted apart, not as a miss."""
    log = [
        converged("fail", [0.0, 0.0, 0.0], length=10),
        converged("win", [1.0, 1.0, 1.0], length=10),
        converged("quick_win", [1.0, 1.0, 1.0], length=2),  # all ended before step 4
        divergent("mixed", [1.0, 0.0, 0.0], length=10),
    ]
    oracle = summarize(replay(build_gate("oracle", k=4), log))
    assert (oracle["all_fail_live"], oracle["all_succeed_live"]) == (1.0, 1.0)
    assert oracle["recall_all_fail"] == oracle["recall_all_succeed"] == 1.0
    assert oracle["recall"] == pytest.approx(2 / 3)  # the quick win was never asked
    # the paper's gate stops converged groups of either class; nothing stops the divergent ones
    gate = summarize(replay(build_gate("prefix_edit", k=4, tau=0.1), log))
    assert gate["recall_all_fail"] == gate["recall_all_succeed"] == 1.0
    stalled = summarize(replay(build_gate("stalled", k=4), log))
    assert stalled["recall_all_fail"] == 1.0 and stalled["recall_all_succeed"] == 1.0
    assert math.isnan(summarize([])["recall_all_succeed"])


def test_the_saving_is_split_by_the_class_of_the_cut_group_beside_what_each_class_held():
    """What there is to save in each half of the waste (the oracle's cut at K) and what a gate
    took of it; a false cut's saving belongs to neither class."""
    log = [
        converged("fail", [0.0, 0.0, 0.0], length=10),
        converged("win", [1.0, 1.0, 1.0], length=6),
        partly("mixed", [0.0, 1.0, 1.0], shared=4),  # alike at K = 4, yet informative
    ]
    total = sum(tokens_after(r) for r in log)
    oracle = summarize(replay(build_gate("oracle", k=4), log))
    assert oracle["oracle_all_fail"] == pytest.approx(tokens_after(log[0], 4) / total)
    assert oracle["oracle_all_succeed"] == pytest.approx(tokens_after(log[1], 4) / total)
    assert 0 < oracle["oracle_all_succeed"] < oracle["oracle_all_fail"]  # the shorter wins hold less
    assert oracle["saved_all_fail"] == pytest.approx(oracle["oracle_all_fail"])
    assert oracle["saved_all_succeed"] == pytest.approx(oracle["oracle_all_succeed"])
    cut_all = summarize(replay(build_gate("prefix_edit", k=4, tau=0.4), log))  # stops every group
    assert cut_all["false_stops"] == 1
    assert cut_all["saved"] > cut_all["saved_all_fail"] + cut_all["saved_all_succeed"]  # the mixed cut
    assert cut_all["saved_all_fail"] == pytest.approx(oracle["oracle_all_fail"])
