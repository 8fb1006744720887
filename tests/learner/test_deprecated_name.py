"""The learner's old package name keeps working for one release: the very modules, renamed."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_old_name_gives_the_same_modules_with_one_deprecation_warning():
    import selective_rollout.learner.losses.policy as new

    sys.modules.pop("selective_rollout.trainer", None)
    with pytest.warns(DeprecationWarning, match="it lives in selective_rollout.learner"):
        import selective_rollout.trainer  # noqa: F401
    import selective_rollout.trainer.losses.policy as old
    from selective_rollout.learner import LearnerGroup
    from selective_rollout.trainer import LearnerGroup as OldLearnerGroup

    assert old is new and OldLearnerGroup is LearnerGroup  # a subclass through either name is one class


def test_the_old_export_command_runs_and_names_the_new_one():
    done = subprocess.run(
        [sys.executable, "-m", "selective_rollout.trainer.export", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "usage: python -m selective_rollout.learner.export" in done.stdout
    assert "use python -m selective_rollout.learner.export" in done.stderr
