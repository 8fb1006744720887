"""The old names of the modules that moved into ``selective_rollout.analysis`` (and the learner's
old package name) keep working for one release: the very modules, with a ``DeprecationWarning``;
``python -m`` of an old name runs the new command and names it on stderr."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from selective_rollout._moved import MOVED, new_name

OLD_MODULES = [
    "selective_rollout.experiment",
    "selective_rollout.policy_eval",
    "selective_rollout.reporting.report",
    "selective_rollout.reporting.power",
    "selective_rollout.reporting.offpolicy",
    "selective_rollout.gate.offline",
    "selective_rollout.gate.offline.evaluate",
    "selective_rollout.gate.offline.fit",
    "selective_rollout.gate.offline.heldout",
    "selective_rollout.gate.offline.paper_reference",
    "selective_rollout.gate.offline.replay",
    "selective_rollout.trajectory_stop.offline",
    "selective_rollout.trainer",
    "selective_rollout.trainer.losses.policy",
]
OLD_COMMANDS = [
    "selective_rollout.experiment",
    "selective_rollout.policy_eval",
    "selective_rollout.gate.offline.evaluate",
    "selective_rollout.gate.offline.fit",
    "selective_rollout.gate.offline.heldout",
    "selective_rollout.trajectory_stop.offline",
    "selective_rollout.trainer.export",
]


def _forget(name: str) -> None:
    """Drop ``name`` and the names under it from the import cache, so importing it runs the alias."""
    for cached in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[cached]


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_name_imports_the_new_module_and_warns(old):
    new = importlib.import_module(new_name(old))
    for prefix in MOVED:
        if old.startswith(prefix):
            _forget(prefix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is new
    assert module.__spec__.name == new.__name__  # its own spec, not the alias's
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert f"{old} is deprecated: it lives in {new.__name__} (the same module, renamed)" in said


def test_a_class_through_the_old_name_is_the_same_class():
    from selective_rollout.analysis.experiment import ExperimentConfig
    from selective_rollout.experiment import ExperimentConfig as Old

    assert Old is ExperimentConfig


@pytest.mark.parametrize("old", OLD_COMMANDS)
def test_an_old_command_runs_the_new_one_and_names_it(old):
    done = subprocess.run([sys.executable, "-m", old, "--help"], capture_output=True, text=True)
    new = new_name(old)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ")
    line = f"python -m {old} is deprecated: use python -m {new}"
    assert done.stderr.splitlines()[0] == line and done.stderr.count("is deprecated: use") == 1


def test_the_new_commands_are_the_ones_their_help_names():
    """``--help`` of each moved command names its new module (its ``prog``)."""
    for old in OLD_COMMANDS:
        new = new_name(old)
        done = subprocess.run([sys.executable, "-m", new, "--help"], capture_output=True, text=True)
        assert done.returncode == 0 and f"usage: python -m {new}" in done.stdout, done.stderr
