"""What an episode shows the player after a reset or a step (light: no engine import, so the
pool's callers and other kinds of game can use it without loading ALFWorld)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Observation:
    obs: str
    admissible: list[str]
    won: bool
    lost: bool = False  # the episode ended without a win (ALFWorld never ends so; TextWorld games can)

    @property
    def done(self) -> bool:
        return self.won or self.lost
