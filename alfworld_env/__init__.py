"""ALFWorld games on the real text engine: the offline game generator, the official data, one
episode (``engine.Episode``) and the play CLI. The Ray pool that serves episodes to a training run
is the environment seam's (``selective_rollout.envs.pool``).

Usable on its own: nothing here imports ``selective_rollout``. The names below load on first use
(PEP 562), so reading the presets (``alfworld_env.presets``) imports neither the engine nor Ray.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "GameError": "alfworld_env.errors",
    "GameInfo": "alfworld_env.games",
    "ensure_games": "alfworld_env.games",
    "load_games": "alfworld_env.games",
    "load_generated": "alfworld_env.games",
    "Observation": "alfworld_env.observation",
    "PRESETS": "alfworld_env.presets",
    "TASK_TYPES": "alfworld_env.presets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
