"""Deprecated name of ``selective_rollout.learner``, kept for one release.

``import selective_rollout.trainer`` and its submodules (``selective_rollout.trainer.losses.policy``,
say) return the very modules of ``selective_rollout.learner`` under the old names, with one
``DeprecationWarning``, so that classes subclassed through either name are the same classes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

OLD, NEW = "selective_rollout.trainer", "selective_rollout.learner"

warnings.warn(
    f"{OLD} is deprecated: the learner lives in {NEW} (the same modules, renamed)",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``selective_rollout.trainer.X`` as the module ``selective_rollout.learner.X``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(OLD + ".") or fullname == f"{OLD}.export":
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(NEW + spec.name[len(OLD) :])

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

from selective_rollout.learner import *  # noqa: E402, F403  (the old name's public names)
from selective_rollout.learner import __all__  # noqa: E402, F401
