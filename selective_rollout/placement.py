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
from typing import TYPE_CHECKING, Any

from selective_rollout.config.placement import COORDINATOR_NUM_CPUS

if TYPE_CHECKING:
    from selective_rollout.config import RunConfig

Location = dict[str, Any]


def here() -> Location:
    """The Ray node, process and malloc of the caller (an actor method calls this on itself)."""
    import ray

    from selective_rollout.process_memory import malloc_in_use

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "malloc": malloc_in_use(),
    }


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


def placement_lines(placement: dict[str, list[Location]]) -> list[str]:
    """A markdown table for report.md from ``placement.json``: one row per actor kind, with the nodes
    it ran on and the malloc its processes got (``placement.*_allocator``; "-" for the env workers,
    which run on their coordinator's, and for files written before actors recorded it)."""
    if not placement:
        return []
    rows = []
    for kind, counts in nodes_by_kind(placement).items():
        mallocs = Counter(loc["malloc"] for loc in placement[kind] if "malloc" in loc)
        rows.append(
            f"| {kind} | {sum(counts.values())} | {len(counts)} | "
            + ", ".join(f"{label} x{n}" for label, n in counts.items())
            + " | "
            + (", ".join(f"{name} x{n}" for name, n in sorted(mallocs.items())) or "-")
            + " |"
        )
    header = [
        "## Placement",
        "",
        "| actors | count | nodes | node (ip/id) x actors | malloc x actors |",
        "|---|---|---|---|---|",
    ]
    return [*header, *rows, ""]


def resource_demand(cfg: RunConfig) -> dict[str, float]:
    """Ray resources the run's actors ask for together (engines, learners, env workers, coordinator)."""
    place, engines, learners = cfg.placement, cfg.engine.num_engines, cfg.trainer.num_learners
    workers = cfg.env.num_workers
    demand: Counter[str] = Counter()
    demand["CPU"] += engines * cfg.engine.num_cpus + learners * place.learner_num_cpus
    demand["CPU"] += workers * place.env_worker_num_cpus + COORDINATOR_NUM_CPUS
    demand["GPU"] += engines * cfg.engine.num_gpus + learners * place.learner_num_gpus
    for count, resources in (
        (engines, place.engine_resources),
        (learners, place.learner_resources),
        (workers, place.env_worker_resources),
        (1, place.coordinator_resources),
    ):
        for name, amount in resources.items():
            demand[name] += count * amount
    return {k: v for k, v in demand.items() if v > 0}


def resource_shortfall(demand: dict[str, float], available: dict[str, float]) -> list[str]:
    """One phrase per resource the cluster lacks, e.g. ``GPU: the run asks for 2, the cluster has 0``."""
    return [
        f"{name}: the run asks for {need:g}, the cluster has {available.get(name, 0.0):g}"
        for name, need in sorted(demand.items())
        if need > available.get(name, 0.0) + 1e-9
    ]
