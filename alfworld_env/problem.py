"""Writing a scenario as an ALFWorld game folder: ``game.tw-pddl`` and ``traj_data.json``.

The PDDL problem follows ALFRED's ``initial_state.pddl`` layout (every otype and rtype declared,
ids mangled the ALFRED way) so the real ALFWorld text engine, its demangler and its grammar
play it exactly like an official game. Success is judged from the goal alone, which comes from
``alfworld.gen.goal_library`` for the same targets as the task text.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

import alfworld.gen.constants as C
import alfworld.gen.goal_library as glib
from alfworld.gen.utils.py_util import multireplace

from alfworld_env.rooms import receptacle_type
from alfworld_env.scenario import Scenario

RTYPES = sorted(set(C.RECEPTACLES) - set(C.MOVABLE_RECEPTACLES))
OTYPES = sorted(C.OBJECTS_SET - set(RTYPES))
# ALFRED's own mangling ("#" is its stand-in for PDDL's type dash).
MANGLE = {"-": "_minus_", "#": "-", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}


def domain_and_grammar() -> tuple[str, str]:
    data = resources.files("alfworld") / "data"
    return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()


def task_text(scn: Scenario, rng: random.Random) -> str:
    """ALFWorld's templated description, drawn from the generator's rng (ALFWorld's own helper
    uses the global random)."""
    template = rng.choice(glib.gdict[scn.task_type]["templates"])
    return template.format(
        obj=scn.object_target.lower(),
        recep=scn.parent_target.lower(),
        toggle=scn.toggle_target.lower(),
        mrecep="",
    )


def _location(i: int) -> str:
    # Numbered, not ALFRED poses: receptacles sharing a pose would otherwise merge by accident.
    return f"loc|{i}|0|0|0"


def pddl_problem(scn: Scenario, name: str) -> str:
    recep_loc = {r: _location(scn.location_of(r)) for r in scn.receptacles}
    start = _location(0)
    objects = sorted(scn.placement)
    decl = ["agent1 # agent"]
    decl += [f"{t}Type # otype" for t in OTYPES] + [f"{t}Type # rtype" for t in RTYPES]
    decl += [f"{o} # object" for o in objects] + [f"{r} # receptacle" for r in scn.receptacles]
    decl += [f"{loc} # location" for loc in dict.fromkeys([start, *recep_loc.values()])]
    init = [f"(atLocation agent1 {start})"]
    for r, loc in recep_loc.items():
        rtype = receptacle_type(r)
        init += [f"(receptacleType {r} {rtype}Type)", f"(receptacleAtLocation {r} {loc})"]
        if rtype in C.OPENABLE_CLASS_SET:
            init.append(f"(openable {r})")
    for o in objects:
        otype, r = o.split("|")[0], scn.placement[o]
        init += [
            f"(objectType {o} {otype}Type)",
            f"(inReceptacle {o} {r})",
            f"(objectAtLocation {o} {recep_loc[r]})",
        ]
        if otype in C.VAL_ACTION_OBJECTS["Toggleable"]:
            init.append(f"(toggleable {o})")
        else:
            init.append(f"(pickupable {o})")
        for ability, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable")):
            if otype in C.VAL_ACTION_OBJECTS[ability]:
                init.append(f"({pred} {o})")
    otypes = {o.split("|")[0] for o in objects}
    for rtype in sorted({receptacle_type(r) for r in scn.receptacles}):
        init += [
            f"(canContain {rtype}Type {t}Type)"
            for t in sorted(otypes)
            if t in C.VAL_RECEPTACLE_OBJECTS[rtype]
        ]
    goal = glib.gdict[scn.task_type]["pddl"].format(
        obj=scn.object_target, recep=scn.parent_target, toggle=scn.toggle_target, mrecep=""
    )
    nl = "\n        "
    text = (
        f"(define (problem {name})\n    (:domain alfred)\n    (:objects\n        {nl.join(decl)}\n    )\n"
        f"    (:init\n        {nl.join(init)}\n    )\n"
    )
    return multireplace(text, MANGLE) + multireplace(goal, {"#": "-"})


def traj_data(scn: Scenario) -> dict:
    return {
        "task_type": scn.task_type,
        "scene": {"floor_plan": f"FloorPlan{scn.room}", "scene_num": scn.room},
        "pddl_params": {
            "object_target": scn.object_target,
            "parent_target": scn.parent_target,
            "toggle_target": scn.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": scn.task_text}]},
        "generator": "alfworld_env",
    }


def game_json(scn: Scenario, name: str, walkthrough: list[str]) -> dict:
    domain, grammar = domain_and_grammar()
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", scn.task_text),
        "pddl_problem": pddl_problem(scn, name),
        "solvable": True,
        "walkthrough": walkthrough,
    }


def write_game(folder: Path, game: dict, scn: Scenario) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "traj_data.json").write_text(json.dumps(traj_data(scn), indent=1))
    tmp = folder / "game.tw-pddl.tmp"
    tmp.write_text(json.dumps(game))
    tmp.replace(folder / "game.tw-pddl")  # a half-written game never looks complete
