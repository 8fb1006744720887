"""A resumed run never repeats a record: its logs are rewound to the checkpoint it resumes from
(the issue's case: killed after logging an iteration, before checkpointing it)."""

from __future__ import annotations

import json

import pytest

from selective_rollout.driver import rewind_logs
from selective_rollout.learner.checkpoint import EXTRA_STATE, checkpoint_name
from selective_rollout.records import GroupRecord, GroupWriter, read_groups
from selective_rollout.reporting.metrics_log import read_metrics


def _checkpoint(ckpt_dir, iteration, evaluated):
    folder = ckpt_dir / checkpoint_name(iteration)
    folder.mkdir(parents=True)
    evals = {label: {} for label in evaluated}
    state = {"iteration": iteration, "cursor": 3 * iteration, "eval": evals, "wall_s": 1.0}
    (folder / EXTRA_STATE).write_text(json.dumps(state))


def _logs(run_dir, iterations, eval_lines):
    with GroupWriter(run_dir / "rollouts.jsonl") as w:
        for it in iterations:
            for n in range(2):
                w.write(GroupRecord(f"it{it}-g{n}", f"task{n}", "pick", [], iteration=it))
    lines = [{"iteration": it, "rollout/step_tokens": 10.0} for it in [*eval_lines, *iterations]]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_lines_after_the_checkpoint_move_aside_once(tmp_path):
    ckpt = tmp_path / "checkpoints"
    _checkpoint(ckpt, 2, ["before"])
    _logs(tmp_path, [0, 1, 2], [-1])  # iteration 2 was logged, then the kill
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"iteration": 3, "rollout/st')  # and a torn line
    rewind_logs(tmp_path, ckpt, "auto")
    assert [g.iteration for g in read_groups(tmp_path / "rollouts.jsonl")] == [0, 0, 1, 1]
    assert [m["iteration"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [-1, 0, 1]
    aside = (tmp_path / "rollouts.jsonl.rewound").read_text().splitlines()
    assert [json.loads(line)["group_id"] for line in aside] == ["it2-g0", "it2-g1"]  # kept, not deleted
    assert len((tmp_path / "metrics.jsonl.rewound").read_text().splitlines()) == 2
    rewind_logs(tmp_path, ckpt, "auto")  # a second resume from the same checkpoint changes nothing
    assert len(list(read_groups(tmp_path / "rollouts.jsonl"))) == 4


def test_a_finished_run_keeps_both_evaluations(tmp_path):
    ckpt = tmp_path / "checkpoints"
    _checkpoint(ckpt, 2, ["before", "after"])
    _logs(tmp_path, [0, 1], [-1])
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"iteration": 2, "eval/success_rate": 0.5}) + "\n")  # "after", at iterations
    rewind_logs(tmp_path, ckpt, "auto")
    assert [m["iteration"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [-1, 0, 1, 2]
    assert not (tmp_path / "metrics.jsonl.rewound").exists()


def test_no_checkpoint_means_a_fresh_start_and_the_old_lines_move_aside(tmp_path):
    _logs(tmp_path, [0], [-1])  # killed during iteration 0: nothing was checkpointed
    rewind_logs(tmp_path, tmp_path / "checkpoints", "auto")
    assert list(read_groups(tmp_path / "rollouts.jsonl")) == []
    assert read_metrics(tmp_path / "metrics.jsonl") == []
    assert len((tmp_path / "rollouts.jsonl.rewound").read_text().splitlines()) == 2


def test_checkpoints_of_the_pickled_format_stop_the_resume(tmp_path):
    legacy = tmp_path / "checkpoints" / "step_00000004"
    legacy.mkdir(parents=True)
    (legacy / "extra_state.pkl").write_bytes(b"planted")
    _logs(tmp_path, [0], [-1])
    with pytest.raises(ValueError, match=r"step_00000004: pickled driver state"):
        rewind_logs(tmp_path, tmp_path / "checkpoints", "auto")
    assert len(list(read_groups(tmp_path / "rollouts.jsonl"))) == 2  # nothing touched


def test_the_final_evaluation_updates_the_last_checkpoint_without_saving_the_model_again(tmp_path):
    """After the last iteration's checkpoint only the driver's state changes (the "after" eval):
    it is replaced in place, atomically, and the weights are not written twice. Without a
    checkpoint of that iteration (none yet, or an older one) the learner saves a full one."""
    from types import SimpleNamespace

    from selective_rollout.driver import Driver
    from selective_rollout.learner.checkpoint import latest_checkpoint, read_extra_state

    ckpt = tmp_path / "checkpoints"
    _checkpoint(ckpt, 2, ["before"])
    weights = ckpt / checkpoint_name(2) / "ds"
    weights.mkdir()
    (weights / "model.pt").write_bytes(b"weights")
    saves = []
    learner = SimpleNamespace(save_checkpoint=lambda d, state: saves.append(state["iteration"]))
    state = {"iteration": 2, "cursor": 6, "eval": {"before": {}, "after": {"success_rate": 0.5}}}
    Driver.save_final_state(SimpleNamespace(ckpt_dir=ckpt, state=state, learner=learner))
    latest = latest_checkpoint(ckpt)
    assert saves == [] and read_extra_state(latest) == state
    assert (weights / "model.pt").read_bytes() == b"weights"
    assert sorted(p.name for p in latest.iterdir()) == ["ds", EXTRA_STATE]  # no staging file left

    state3 = {**state, "iteration": 3}
    Driver.save_final_state(SimpleNamespace(ckpt_dir=ckpt, state=state3, learner=learner))
    assert saves == [3] and read_extra_state(latest)["iteration"] == 2
    Driver.save_final_state(SimpleNamespace(ckpt_dir=tmp_path / "none", state=state, learner=learner))
    assert saves == [3, 2]


def test_updating_the_state_of_an_incomplete_checkpoint_is_refused(tmp_path):
    from selective_rollout.learner.checkpoint import update_extra_state

    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        update_extra_state(tmp_path, {"iteration": 1})
    assert list(tmp_path.iterdir()) == []
