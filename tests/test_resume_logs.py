"""A resumed run never repeats a record: its logs are rewound to the checkpoint it resumes from
(the issue's case: killed after logging an iteration, before checkpointing it)."""

from __future__ import annotations

import json

import pytest

from selective_rollout.records import GroupRecord, GroupWriter, read_groups
from selective_rollout.reporting.metrics_log import read_metrics
from selective_rollout.train import rewind_logs
from selective_rollout.trainer.checkpoint import EXTRA_STATE, checkpoint_name


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
