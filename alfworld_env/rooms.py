"""ALFRED rooms as the generator needs them, read from the layouts that ship inside ``alfworld``.

Only what a text game needs is kept: which receptacles a room has (with their real ALFRED ids),
which object types occur in it, and its scene type. Train/test room numbers are ALFRED's own,
so ``valid_unseen`` games are set in rooms that no train game uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import alfworld.gen.constants as C

SCENE_TYPES: dict[str, range] = dict(C.SCENE_TYPE)


@dataclass(frozen=True)
class Room:
    number: int
    scene_type: str
    receptacles: tuple[str, ...]  # ALFRED ids, e.g. "Sink|-01.90|+00.97|-01.50|SinkBasin"
    object_types: frozenset[str]

    def receptacles_of(self, rtype: str) -> list[str]:
        return [r for r in self.receptacles if receptacle_type(r) == rtype]

    @property
    def receptacle_types(self) -> set[str]:
        return {receptacle_type(r) for r in self.receptacles}


def receptacle_type(rid: str) -> str:
    """ALFRED names a sink's basin by a suffix: ``Sink|...|SinkBasin`` is a ``SinkBasin``."""
    parts = rid.split("|")
    return parts[-1] if parts[-1].endswith("Basin") else parts[0]


def _layouts():
    return resources.files("alfworld.gen") / "layouts"


@cache
def load_room(number: int) -> Room:
    base = _layouts()
    receps = json.loads((base / f"FloorPlan{number}-openable.json").read_text())
    objects = json.loads((base / f"FloorPlan{number}-objects.json").read_text())
    scene_type = next(t for t, nums in SCENE_TYPES.items() if number in nums)
    return Room(number, scene_type, tuple(sorted(receps)), frozenset(objects))


def room_numbers(unseen: bool) -> list[int]:
    """ALFRED's test rooms are the unseen ones; everything else is for train and valid_seen."""
    return sorted(C.TEST_SCENE_NUMBERS if unseen else C.TRAIN_SCENE_NUMBERS)
