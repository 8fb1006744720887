"""Our scripted solver: a plan from the known object positions, checked on the real engine.

ALFWorld's handcoded expert fails on pick_two tasks and its planner takes minutes per kitchen,
so the generator plans itself (every position is known when the game is made) and keeps a game
only if every command of the plan is admissible when played and the engine reports ``won`` on
the plan's last step and on no step before.
"""

from __future__ import annotations

import alfworld.gen.constants as C
from alfworld.gen.utils.py_util import multireplace

from alfworld_env.engine import Episode
from alfworld_env.problem import MANGLE
from alfworld_env.rooms import receptacle_type
from alfworld_env.scenario import APPLIANCE, Scenario


class Unsolvable(RuntimeError):
    """The plan did not win (or won too early): the game is not written."""


def _key(alfred_id: str) -> str:
    return multireplace(alfred_id, MANGLE).lower()


def plan(scn: Scenario) -> list[tuple]:
    """Abstract steps (verb, ids...) that reach the goal from the initial placement."""
    steps: list[tuple] = []
    opened: set[str] = set()
    here = 0  # the agent starts in the middle of the room

    def go(r: str) -> None:
        # The engine offers no "go to" a receptacle at the agent's own location.
        nonlocal here
        if scn.location_of(r) != here:
            steps.append(("go to", r))
            here = scn.location_of(r)

    def visit(r: str) -> None:
        go(r)
        if receptacle_type(r) in C.OPENABLE_CLASS_SET and r not in opened:
            steps.append(("open", r))
            opened.add(r)

    targets = scn.objects_of(scn.object_target)
    wanted = 2 if scn.task_type == "pick_two_obj_and_place" else 1
    dest = next((r for r in scn.receptacles if receptacle_type(r) == scn.parent_target), None)
    for obj in targets[:wanted]:
        src = scn.placement[obj]
        visit(src)
        steps.append(("take", obj, src))
        if scn.task_type in APPLIANCE:
            appliance = next(r for r in scn.receptacles if receptacle_type(r) == APPLIANCE[scn.task_type][0])
            go(appliance)
            verb = {"SinkBasin": "clean", "Microwave": "heat", "Fridge": "cool"}[receptacle_type(appliance)]
            steps.append((verb, obj, appliance))
        if scn.toggle_target:
            lamp = scn.objects_of(scn.toggle_target)[0]
            go(scn.placement[lamp])
            steps.append(("use", lamp))
        else:
            visit(dest)
            steps.append(("move", obj, dest))
    return steps


def to_commands(steps: list[tuple], names: dict[str, str]) -> list[str]:
    def n(alfred_id: str) -> str:
        return names[_key(alfred_id)]

    out = []
    for verb, *ids in steps:
        if verb == "take":
            out.append(f"take {n(ids[0])} from {n(ids[1])}")
        elif verb == "move":
            out.append(f"move {n(ids[0])} to {n(ids[1])}")
        elif verb in ("clean", "heat", "cool"):
            out.append(f"{verb} {n(ids[0])} with {n(ids[1])}")
        else:
            out.append(f"{verb} {n(ids[0])}")
    return out


def solve(scn: Scenario, game: dict) -> list[str]:
    """The walkthrough of ``game``, verified on the engine; raises Unsolvable otherwise."""
    ep = Episode(game)
    try:
        ob = ep.reset()
        commands = to_commands(plan(scn), ep.names())
        for i, cmd in enumerate(commands):
            if cmd not in ob.admissible:
                raise Unsolvable(f"step {i} {cmd!r} is not admissible: {ob.admissible}")
            ob = ep.step(cmd)
            last = i == len(commands) - 1
            if ob.won != last:
                raise Unsolvable(f"step {i} {cmd!r}: won={ob.won} ({ob.obs!r})")
        return commands
    finally:
        ep.close()
