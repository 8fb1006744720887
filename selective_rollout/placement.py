"""Where a run's actors actually ran: ``placement.json`` in the run folder and a report section.

On a cluster the resources asked for (``placement`` config section) and where Ray put the
actors can differ silently, e.g. env workers packed onto the head because a node group was
mislabelled. Each actor reports its own node; the driver records them once after start-up.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

Location = dict[str, Any]


def here() -> Location:
    """The Ray node and process of the caller (an actor method calls this on itself)."""
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


def write_placement(run_dir: Path, placement: dict[str, list[Location]]) -> Path:
    path = run_dir / "placement.json"
    path.write_text(json.dumps(placement, indent=2, sort_keys=True))
    return path


def read_placement(run_dir: Path) -> dict[str, list[Location]]:
    path = run_dir / "placement.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def nodes_by_kind(placement: dict[str, list[Location]]) -> dict[str, dict[str, int]]:
    """Actor kind -> {node label: actors of that kind on it}; labels are ``ip/node-id-prefix``."""
    return {
        kind: dict(sorted(Counter(f"{loc['node_ip']}/{loc['node_id'][:8]}" for loc in locations).items()))
        for kind, locations in placement.items()
    }


def placement_lines(nodes: dict[str, dict[str, int]]) -> list[str]:
    """A markdown table for report.md from ``nodes_by_kind``: one row per actor kind."""
    if not nodes:
        return []
    rows = [
        f"| {kind} | {sum(counts.values())} | {len(counts)} | "
        + ", ".join(f"{label} x{n}" for label, n in counts.items())
        + " |"
        for kind, counts in nodes.items()
    ]
    header = ["## Placement", "", "| actors | count | nodes | node (ip/id) x actors |", "|---|---|---|---|"]
    return [*header, *rows, ""]
