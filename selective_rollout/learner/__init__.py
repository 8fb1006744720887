"""The learner side: advantages, GRPO loss, packing, DeepSpeed learners, sync.

The re-exports load on first use (PEP 562), so importing a light submodule, as config
validation does with ``trainer.losses``, does not import Ray and DeepSpeed.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "LearnerGroup": "selective_rollout.learner.learner_group",
    "WeightSyncFailed": "selective_rollout.learner.learner_group",
    "latest_checkpoint": "selective_rollout.learner.checkpoint",
}

__all__ = ["LearnerGroup", "WeightSyncFailed", "latest_checkpoint"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
