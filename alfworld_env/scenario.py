"""Sampling one ALFWorld-domain task in a real ALFRED room: what is where, and what to do.

A scenario is pure data (ids and types); ``problem`` turns it into PDDL and ``solver`` plans it.
Everything random goes through the caller's ``random.Random`` so a seed fixes the game.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import alfworld.gen.constants as C

from alfworld_env.presets import TASK_TYPES, Preset
from alfworld_env.rooms import Room, load_room, receptacle_type, room_numbers

APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
LAMPS = ("DeskLamp", "FloorLamp")
PICKUPABLE: frozenset[str] = frozenset().union(*C.VAL_RECEPTACLE_OBJECTS.values()) - {
    t for t in C.OBJECTS if t.endswith("Sliced")
}


@dataclass
class Scenario:
    task_type: str
    room: int
    object_target: str
    parent_target: str  # receptacle type of the goal ("" for look_at_obj_in_light)
    toggle_target: str  # lamp type for look_at_obj_in_light, else ""
    receptacles: list[str]  # ALFRED receptacle ids in the game
    placement: dict[str, str] = field(default_factory=dict)  # object id -> receptacle id
    task_text: str = ""
    one_spot: bool = False  # every receptacle at one location (Preset.compact)

    def objects_of(self, otype: str) -> list[str]:
        return [o for o in self.placement if o.split("|")[0] == otype]

    def location_of(self, receptacle: str) -> int:
        """Location number of a receptacle; 0 is the middle of the room, where the agent starts."""
        return 1 if self.one_spot else self.receptacles.index(receptacle) + 1


class NoFit(Exception):
    """This room cannot host the requested task; the sampler tries another."""


def _can_hold(rtype: str, otype: str) -> bool:
    return otype in C.VAL_RECEPTACLE_OBJECTS.get(rtype, ())


def _is_open(rtype: str) -> bool:
    return rtype not in C.OPENABLE_CLASS_SET


def _object_id(otype: str, rng: random.Random, taken: set[str]) -> str:
    while True:
        x, y, z = (rng.uniform(-3, 3) for _ in range(3))
        oid = f"{otype}|{x:+06.2f}|{abs(y):+06.2f}|{z:+06.2f}"
        if oid not in taken:
            taken.add(oid)
            return oid


def _sample_in_room(task_type: str, room: Room, preset: Preset, rng: random.Random) -> Scenario:
    rtypes = room.receptacle_types
    appliance, ability = APPLIANCE.get(task_type, (None, None))
    if appliance and appliance not in rtypes:
        raise NoFit
    candidates = sorted(room.object_types & PICKUPABLE)
    if ability:
        candidates = [o for o in candidates if o in C.VAL_ACTION_OBJECTS[ability]]
    lamp = ""
    if task_type == "look_at_obj_in_light":
        lamps = sorted(room.object_types & set(LAMPS))
        hosts = [r for r in room.receptacles if _is_open(receptacle_type(r))]
        if not lamps or not hosts:
            raise NoFit
        lamp = rng.choice(lamps)
    rng.shuffle(candidates)
    for otype in candidates:
        sources = [r for r in room.receptacles if _can_hold(receptacle_type(r), otype)]
        if preset.compact:
            sources = [r for r in sources if _is_open(receptacle_type(r))]
        if lamp:
            parents, parent_type = [], ""
        else:
            ptypes = sorted(t for t in rtypes if _can_hold(t, otype) and t != appliance)
            if preset.compact:
                ptypes = [t for t in ptypes if _is_open(t)]
            if not ptypes:
                continue
            parent_type = rng.choice(ptypes)
            parents = room.receptacles_of(parent_type)
            if preset.compact and appliance:
                sources = parents  # the goal stays unmet until the target is treated
            else:
                sources = [r for r in sources if receptacle_type(r) not in (parent_type, appliance)]
        if not sources:
            continue
        if preset.compact:
            sources = [rng.choice(sources)]  # every copy in one place
            parents = sources if appliance else parents
        return _populate(task_type, room, preset, rng, otype, parent_type, lamp, sources, parents, appliance)
    raise NoFit


def _populate(
    task_type, room, preset, rng, otype, parent_type, lamp, sources, parents, appliance
) -> Scenario:
    taken: set[str] = set()
    chosen: list[str] = []
    placement: dict[str, str] = {}
    count = (2 if task_type == "pick_two_obj_and_place" else 1) * preset.copies
    for _ in range(count):
        src = rng.choice(sources)
        chosen.append(src)
        placement[_object_id(otype, rng, taken)] = src
    if parents:
        chosen.append(rng.choice(parents))
    if appliance:
        chosen.append(rng.choice(room.receptacles_of(appliance)))
    if lamp:
        hosts = [r for r in room.receptacles if _is_open(receptacle_type(r))]
        host = rng.choice(hosts)
        chosen.append(host)
        placement[_object_id(lamp, rng, taken)] = host
    rest = [r for r in room.receptacles if r not in chosen]
    rng.shuffle(rest)
    extra = len(rest) if preset.extra_receptacles is None else preset.extra_receptacles
    receptacles = sorted(set(chosen) | set(rest[:extra]))
    others = sorted((room.object_types & PICKUPABLE) - {otype})
    rng.shuffle(others)
    for dtype in others[: preset.distractors]:
        holders = [r for r in receptacles if _can_hold(receptacle_type(r), dtype)]
        if holders:
            placement[_object_id(dtype, rng, taken)] = rng.choice(holders)
    return Scenario(
        task_type, room.number, otype, parent_type, lamp, receptacles, placement, one_spot=preset.compact
    )


def sample_scenario(task_type: str, unseen: bool, preset: Preset, rng: random.Random) -> Scenario:
    """Pick a room that can host ``task_type`` (not every room has every appliance) and fill it."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPES}")
    allowed = C.GOALS_VALID[task_type]
    rooms = [n for n in room_numbers(unseen) if load_room(n).scene_type in allowed]
    rng.shuffle(rooms)
    for number in rooms:
        try:
            return _sample_in_room(task_type, load_room(number), preset, rng)
        except NoFit:
            continue
    raise RuntimeError(f"no ALFRED room can host a {task_type} task (unseen={unseen})")
