"""ALFWorld episodes on the real text engine: offline game generator, official data, Ray EnvPool.

Usable on its own: nothing here imports ``selective_rollout``.
"""

from alfworld_env.errors import GameError
from alfworld_env.games import GameInfo, ensure_games, load_games, load_generated
from alfworld_env.pool import EnvPool, EpisodeState
from alfworld_env.scenario import PRESETS, TASK_TYPES

__all__ = [
    "PRESETS",
    "TASK_TYPES",
    "EnvPool",
    "EpisodeState",
    "GameError",
    "GameInfo",
    "ensure_games",
    "load_games",
    "load_generated",
]
