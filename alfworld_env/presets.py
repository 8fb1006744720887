"""The generated games' sizes and task types, and how a mix of presets is dealt: plain data, so a
config naming a preset is checked without importing the ALFWorld engine or Ray."""

from __future__ import annotations

from dataclasses import dataclass

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


@dataclass(frozen=True)
class Preset:
    """How big a game is. ``extra_receptacles=None`` keeps every receptacle of the room.

    A uniform-random policy spends most of its steps on commands that change nothing (help, look,
    inventory and examine are always on offer: 3-6 of the 5-9 commands of a tiny game), so every
    walk between receptacles and every door to open makes a chance win much rarer. ``compact``
    removes both: every receptacle of the game stands at one spot (one "go to" reaches them all),
    the target starts in an open receptacle and goes to an open one, and a clean/heat/cool target
    starts on its goal receptacle, next to the appliance (take, treat, put back). ``copies``
    instances of the target per object the task needs make a lucky "take" likelier.
    """

    extra_receptacles: int | None
    distractors: int
    copies: int = 1
    compact: bool = False


# tiny is sized by measurement (bench/env_throughput.py) so that a uniform-random policy wins
# 20-50% of 15-step episodes; medium and small keep walking and opening (medium with fewer places
# to search); full keeps ALFWorld's whole rooms.
PRESETS: dict[str, Preset] = {
    "tiny": Preset(extra_receptacles=0, distractors=0, copies=2, compact=True),
    "medium": Preset(extra_receptacles=1, distractors=2),
    "small": Preset(extra_receptacles=4, distractors=3),
    "full": Preset(extra_receptacles=None, distractors=10),
}


def preset_of(preset: str, index: int) -> str:
    """The preset of game ``index`` in a set named ``preset``: one preset (``tiny``), or a mix
    (``tiny+small``) dealt in blocks of six games, one of each task type, so that every task type
    comes in every preset of the mix."""
    parts = preset.split("+")
    unknown = [p for p in parts if p not in PRESETS]
    if unknown or not parts:
        raise ValueError(
            f"unknown preset {preset!r}; expected one of {sorted(PRESETS)} or a mix like tiny+small"
        )
    return parts[(index // len(TASK_TYPES)) % len(parts)]
