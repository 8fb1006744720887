"""rollouts.jsonl round-trips and survives a torn last line."""

import json

import pytest

from selective_rollout.records import (
    Experience,
    GateRecord,
    GroupRecord,
    GroupWriter,
    LogLineError,
    Outcome,
    Step,
    Trajectory,
    TrajectoryStatus,
    TrajectoryStop,
    read_groups,
    version_runs,
)


def _group(gid="g0"):
    return GroupRecord(
        group_id=gid,
        task_id="train/t0",
        task_type="pick_heat_then_place_in_recep",
        trajectories=[
            Trajectory(
                0, [Step("go to x", True, 100, 5, 0.0, False)], reward=None, status=TrajectoryStatus.CUT
            ),
            Trajectory(
                1, [Step("look", False, 100, 7, 0.0, False)], reward=None, status=TrajectoryStatus.CUT
            ),
        ],
        outcome=Outcome.CUT,
        gate=GateRecord(step=1, stop=True, reason="D_1=0 < 0.1", features={"prefix_edit_distance": 0.0}),
    )


def test_round_trip(tmp_path):
    path = tmp_path / "r.jsonl"
    with GroupWriter(path) as w:
        w.write(_group("a"))
        w.write(_group("b"))
    groups = list(read_groups(path))
    assert [g.group_id for g in groups] == ["a", "b"]
    assert groups[0] == _group("a")
    assert groups[0].zero_variance is None and groups[0].step_tokens == 212


def test_torn_last_line_is_skipped_but_inner_damage_is_an_error(tmp_path):
    path = tmp_path / "r.jsonl"
    line = _group().to_json()
    path.write_text(line + "\n" + line[: len(line) // 2])
    assert len(list(read_groups(path))) == 1
    path.write_text(line[: len(line) // 2] + "\n" + line + "\n")
    with pytest.raises(LogLineError, match=r"r.jsonl:1"):
        list(read_groups(path))


@pytest.mark.parametrize("line", ["null", "[1, 2]", '"text"'])
def test_a_line_that_is_not_an_object_is_named(tmp_path, line):
    path = tmp_path / "r.jsonl"
    path.write_text(_group().to_json() + "\n" + line + "\n" + _group().to_json() + "\n")
    with pytest.raises(LogLineError, match=r"r.jsonl:2: .*not an object"):
        list(read_groups(path))


def test_a_nan_reward_is_rejected(tmp_path):
    path = tmp_path / "r.jsonl"
    line = _group().to_json().replace('"reward":null', '"reward":NaN', 1)
    path.write_text(line + "\n" + _group().to_json() + "\n")
    with pytest.raises(LogLineError, match=r"r.jsonl:1: .*reward is nan, not a finite number"):
        list(read_groups(path))


def test_experience_validates_lengths():
    with pytest.raises(ValueError, match="one length"):
        Experience("g", "t", "x", [1, 2], [1], [0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="finite"):
        Experience("g", "t", "x", [1], [1], [0.0], float("nan"))


def test_a_group_is_all_fail_all_succeed_mixed_or_unknown():
    def record(rewards):
        trajs = [Trajectory(index=i, steps=[Step(action="go")], reward=r) for i, r in enumerate(rewards)]
        return GroupRecord("g", "t", "pick", trajs)

    assert record([0.0, 0.0]).reward_class == "all-fail"
    assert record([1.0, 1.0]).reward_class == "all-succeed"
    assert record([0.0, 1.0]).reward_class == "mixed"
    assert record([None, 1.0]).reward_class is None


def _stopped_group():
    steps = [Step("go to desk 1", True, 100, 5)] * 3
    return GroupRecord(
        group_id="s",
        task_id="train/t1",
        task_type="look_at_obj_in_light",
        trajectories=[
            Trajectory(0, steps[:2], reward=1.0, won=True),
            Trajectory(
                1, steps, reward=0.0, status=TrajectoryStatus.STOPPED, stop=TrajectoryStop(3, 0.0, "outlived")
            ),
            Trajectory(
                2, steps * 2, reward=1.0, won=True, stop=TrajectoryStop(3, 0.0, "outlived", audited=True)
            ),
            Trajectory(3, steps * 2, reward=0.0, stop=TrajectoryStop(4, 0.0, "looping", audited=True)),
        ],
    )


def test_trajectory_stops_round_trip_and_say_whether_an_audited_label_was_right(tmp_path):
    path = tmp_path / "r.jsonl"
    with GroupWriter(path) as w:
        w.write(_stopped_group())
    (group,) = read_groups(path)
    assert group == _stopped_group()
    stopped = group.trajectories[1]
    assert stopped.status is TrajectoryStatus.STOPPED and stopped.reward == 0.0
    assert stopped.stop.rule == "outlived" and not stopped.stop.audited
    # only an audited stop has a measured label: the late winner's was wrong, the looper's right
    assert [t.label_right for t in group.trajectories] == [None, None, False, True]
    assert '"stop":null' not in path.read_text()  # a trajectory without a stop writes no field


def test_a_line_written_before_trajectory_stops_reads_without_them(tmp_path):
    path = tmp_path / "r.jsonl"
    line = _group().to_json()
    assert not any("stop" in t for t in json.loads(line)["trajectories"])  # the old form of a line
    path.write_text(line + "\n")
    (group,) = read_groups(path)
    assert all(t.stop is None and t.label_right is None for t in group.trajectories)


def test_a_stop_without_a_finite_assigned_reward_is_rejected():
    line = _stopped_group().to_dict()
    line["trajectories"][1]["stop"]["assigned"] = None
    with pytest.raises(ValueError, match="assigned reward is null"):
        GroupRecord.from_dict(line)


def test_policy_versions_round_trip_and_schema_1_lines_read_as_version_0(tmp_path):
    path = tmp_path / "r.jsonl"
    versioned = _group("v")
    versioned.policy_version = 3
    schema_1 = {**_group("old").to_dict(), "schema": 1}
    del schema_1["policy_version"]  # a line written before versions were logged
    path.write_text(versioned.to_json() + "\n" + json.dumps(schema_1) + "\n")
    new, old = read_groups(path)
    assert json.loads(versioned.to_json())["schema"] == 3
    assert (new.policy_version, old.policy_version) == (3, 0)
    path.write_text(json.dumps({**schema_1, "schema": 4}) + "\n")
    with pytest.raises(LogLineError, match="unsupported rollouts schema version 4"):
        list(read_groups(path))


def test_a_reply_spanning_versions_is_logged_as_runs_and_a_plain_one_adds_nothing():
    """Weights that reach the engines mid-rollout make a reply's tokens differ from their group's
    version; a line says so per step, as [version, tokens] runs, and only then."""
    assert version_runs([4, 4, 5, 5, 5], 4) == [[4, 2], [5, 3]]
    assert version_runs([5, 5], 4) == [[5, 2]]  # a later turn, played after an update
    assert version_runs([4, 4], 4) == [] and version_runs([], 4) == []
    group = _group("s")
    group.policy_version = 4
    group.trajectories[0].steps[0].version_runs = [[4, 2], [5, 3]]
    line = json.loads(group.to_json())
    first, second = (t["steps"][0] for t in line["trajectories"])
    assert first["version_runs"] == [[4, 2], [5, 3]] and "version_runs" not in second
    assert GroupRecord.from_dict(line) == group
    schema_2 = {**line, "schema": 2}
    del schema_2["trajectories"][0]["steps"][0]["version_runs"]  # written before runs were logged
    assert GroupRecord.from_dict(schema_2).trajectories[0].steps[0].version_runs == []
