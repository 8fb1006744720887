"""ALFWorld episodes on the real text engine: offline game generator, official data, Ray EnvPool
(which serves other kinds of text game too, see ``GameKind``).

Usable on its own: nothing here imports ``selective_rollout``.
"""

from alfworld_env.errors import GameError
from alfworld_env.games import GameInfo, ensure_games, load_games, load_generated
from alfworld_env.observation import Observation
from alfworld_env.pool import AlfworldGames, EnvPool, EpisodeState, GameKind, Playable
from alfworld_env.scenario import PRESETS, TASK_TYPES

__all__ = [
    "PRESETS",
    "TASK_TYPES",
    "AlfworldGames",
    "EnvPool",
    "EpisodeState",
    "GameError",
    "GameInfo",
    "GameKind",
    "Observation",
    "Playable",
    "ensure_games",
    "load_games",
    "load_generated",
]
