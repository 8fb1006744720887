"""Old module names kept working for one release after a move: the very modules, renamed.

``import selective_rollout.experiment`` (or any name under a moved prefix) returns the module now at
the new name, with one ``DeprecationWarning``, so that a class subclassed or a function patched
through either name is one object. ``python -m <old name>`` prints one deprecation line to stderr
and runs ``python -m <new name>`` with the same arguments. The package installs the aliases of
``MOVED`` when it is first imported; nothing here imports the modules it names until they are asked
for, so the layers (tests/test_layers.py) are untouched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old name -> new name; a name under an old one moves with it (``gate.offline.heldout``)
MOVED = {
    "selective_rollout.trainer": "selective_rollout.learner",
    "selective_rollout.experiment": "selective_rollout.analysis.experiment",
    "selective_rollout.policy_eval": "selective_rollout.analysis.policy_eval",
    "selective_rollout.gate.offline": "selective_rollout.analysis.gate_eval",
    "selective_rollout.trajectory_stop.offline": "selective_rollout.analysis.trajectory_stop_eval",
    "selective_rollout.reporting.report": "selective_rollout.analysis.report",
    "selective_rollout.reporting.power": "selective_rollout.analysis.power",
    "selective_rollout.reporting.offpolicy": "selective_rollout.analysis.offpolicy",
}


def new_name(old: str, moved: dict[str, str] = MOVED) -> str | None:
    """Where the module ``old`` lives now; None when it did not move."""
    for prefix, target in moved.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix) :]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Finds an old name as the module at its new name; ``get_code`` is what ``python -m`` runs."""

    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname, self.moved)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, self, loader_state=new)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is deprecated: it lives in {spec.loader_state} (the same module, renamed)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(spec.loader_state)
        spec.loader_state = module.__spec__  # the import system sets the alias's on the module next
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed: only its own ``__spec__`` is put back (a
        reload, or pickling by spec, follows the real module)."""
        module.__spec__ = module.__spec__.loader_state

    def get_source(self, fullname: str) -> str:
        """What ``python -m`` of an old name runs (``InspectLoader.get_code`` compiles it)."""
        new = new_name(fullname, self.moved)
        return (
            "import runpy, sys\n"
            f"print('python -m {fullname} is deprecated: use python -m {new}', file=sys.stderr)\n"
            f"runpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n"
        )


def install(moved: dict[str, str] = MOVED) -> None:
    """Make every old name of ``moved`` import (and run) as its new one; once per process."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias(moved))
