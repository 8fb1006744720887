"""The package's layers (docs/design.md): every import inside ``selective_rollout`` points down or
sideways, never up, so that the gate library, the records and the environments stay usable without
the coordinator, the learner or the driver.

Read from the source with ``ast`` (module-level and deferred imports alike), so a new upward
import fails here with the file and the line, whatever code path would have loaded it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "selective_rollout"

# The floor of every module, by the longest dotted prefix that names it.
FLOORS = {
    "_moved": 1,  # old module names -> new ones, as strings: it imports none of them
    "records": 1,
    "lifecycle": 1,  # a group's phases: runs, replay and LiveGroup drive it
    "registry": 1,
    "plugins": 1,
    "stats": 1,
    "models": 1,
    "placement": 1,
    "runtime": 1,
    "precision": 1,
    "process_memory": 1,
    "gate": 1,
    "trajectory_stop": 1,
    "envs": 1,
    "config": 1,
    "weight_sync": 1,
    "reporting": 1,  # what a run writes about itself while it runs (metrics, idle shares)
    "rollout": 2,
    "integrations": 2,
    "warm_start_cache": 2,  # where a warm start is cached: what the learner's export needs of it
    "learner": 3,
    "sft": 4,  # builds the warm start with the learner's modelling
    "driver": 5,
    "analysis": 6,  # the offline analysis: over logs, runs and experiments; nothing run-time imports it
    "train": 7,  # the command line: the driver's run, then the report (analysis)
}


def floor_of(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in FLOORS:
            return FLOORS[prefix]
    raise KeyError(f"selective_rollout.{module} has no floor in tests/test_layers.py: add it to FLOORS")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _submodule(module: str, name: str) -> str:
    """``module.name`` when that is a module or package of ours, else ``module`` (a name in it)."""
    path = PACKAGE.parent.joinpath(*module.split("."), name)
    return f"{module}.{name}" if path.is_dir() or path.with_suffix(".py").is_file() else module


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """(module inside the package, line) for every import of ``selective_rollout.*`` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from selective_rollout.rollout import strategies`` imports the submodule
            names = [_submodule(node.module, alias.name) for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("selective_rollout."):
                found.append((name.removeprefix("selective_rollout."), node.lineno))
    return found


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        if not importer:
            continue
        own = floor_of(importer)
        for target, line in imported_modules(path):
            if floor_of(target) <= own:
                continue
            rel = path.relative_to(PACKAGE.parent)
            bad.append(
                f"{rel}:{line}: floor {own} imports selective_rollout.{target} (floor {floor_of(target)})"
            )
    return bad


def test_every_module_has_a_floor():
    for path in PACKAGE.rglob("*.py"):
        if module_name(path):
            floor_of(module_name(path))


def test_imports_only_point_down():
    assert upward_imports() == []


def import_cycles() -> list[list[str]]:
    """Modules of the package that import each other in a loop (deferred and type-only imports
    included): the strongly connected components of the import graph with more than one module."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        if importer:
            graph[importer] = {target for target, _ in imported_modules(path) if target != importer}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_through_others():
    assert import_cycles() == []


def test_an_import_cycle_is_caught(tmp_path, monkeypatch):
    fake = tmp_path / "selective_rollout"
    (fake / "gate").mkdir(parents=True)
    (fake / "gate" / "a.py").write_text("from selective_rollout.gate import b\n")
    (fake / "gate" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import selective_rollout.gate.a\n"
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert import_cycles() == [["gate.a", "gate.b"]]


def test_an_upward_import_is_caught(tmp_path, monkeypatch):
    """The check itself: a gate module that imports the coordinator is reported with its line."""
    fake = tmp_path / "selective_rollout"
    (fake / "gate").mkdir(parents=True)
    (fake / "gate" / "bad.py").write_text("import os\nfrom selective_rollout.rollout.coordinator import X\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert upward_imports() == [
        "selective_rollout/gate/bad.py:2: floor 1 imports selective_rollout.rollout.coordinator (floor 2)"
    ]


@pytest.mark.parametrize("module", ["gate.base", "records", "envs.alfworld", "weight_sync.collective"])
def test_the_lowest_floor_is_floor_one(module):
    assert floor_of(module) == 1
