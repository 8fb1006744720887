"""A run folder that some actor cannot see is one clear error at start-up (issue 14)."""

from __future__ import annotations

from pathlib import Path

from selective_rollout.driver import unshared_run_dir_error


def test_every_actor_seeing_the_run_folder_is_fine(tmp_path: Path) -> None:
    assert unshared_run_dir_error(tmp_path, {"learner 0": True, "coordinator": True}) is None


def test_actors_that_cannot_see_it_are_named_with_the_fix(tmp_path: Path) -> None:
    error = unshared_run_dir_error(tmp_path, {"learner 0": True, "learner 1": False, "coordinator": False})
    assert error is not None and "learner 1, coordinator" in error and "learner 0" not in error
    assert str(tmp_path.resolve()) in error and "driver.runs_dir" in error
