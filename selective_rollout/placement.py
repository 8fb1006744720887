"""Where a run's actors actually ran: ``placement.json`` in the run folder and a report section.

On a cluster the resources asked for (``placement`` config section) and where Ray put the
actors can differ silently, e.g. env workers packed onto the head because a node group was
mislabelled. Each actor reports its own node; the driver records them once after start-up.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selective_rollout.config.placement import COORDINATOR_NUM_CPUS
from selective_rollout.process_memory import Location

if TYPE_CHECKING:
    from selective_rollout.config import RunConfig

log = logging.getLogger(__name__)


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


class ActorsPending(ValueError):
    """Actors Ray did not start within ``placement.pending_timeout_s``. A ``ValueError``, so the
    driver's command line prints it as its one line and exits 2, like the other start-up refusals."""


def _listed(names: list[str]) -> str:
    """``engine 2, engine 5, coordinator`` as ``engines 2, 5; coordinator``: a run of 16 engines
    still reads as one short line."""
    kinds: dict[str, list[str]] = {}
    for name in names:
        kind, _, index = name.rpartition(" ")
        if kind and index.isdigit():
            kinds.setdefault(kind, []).append(index)
        else:
            kinds.setdefault(name, [])
    return "; ".join(
        kind if not ix else f"{kind} {ix[0]}" if len(ix) == 1 else f"{kind}s {', '.join(ix)}"
        for kind, ix in kinds.items()
    )


def pending_error(
    names: list[str], waited_s: float, demand: dict[str, float], cluster: dict[str, float]
) -> str:
    """The one line that stops a run whose actors ``names`` are still pending after ``waited_s``:
    what the cluster lacks for the run's ``demand``, or, when it has enough in total, that
    something else holds it."""
    short = resource_shortfall(demand, cluster)
    if short:
        why = "the cluster lacks " + "; ".join(short)
        fix = (
            "add nodes with those resources or lower the run's (engine.num_engines, engine.num_gpus, "
            "trainer.num_learners, env.num_workers, placement.*)"
        )
    else:
        asked = ", ".join(f"{name} {need:g}" for name, need in sorted(demand.items()))
        why = f"the cluster has what the run asks for in total ({asked}), but other actors or jobs hold it"
        fix = "free it (`ray status` shows who holds what)"
    return (
        f"{_listed(names)} still pending after {waited_s:g} s: {why}; {fix}, "
        "or raise placement.pending_timeout_s if nodes are still being added"
    )


def unplaced_actors(refs: list[Any]) -> list[Any]:
    """The refs (actor method calls) whose actor Ray has not yet given a worker process.

    Ray reports an actor PENDING_CREATION both while no node has room for it and while its
    ``__init__`` runs (a 7B model's load and compile take minutes); only the first is a placement
    problem. The GCS actor table tells them apart: a placed actor has a worker process (``Pid``).
    A ref that is not an actor call, or a table Ray cannot read, counts as unplaced, so the
    time-out still holds."""
    from ray._private import state

    out = []
    for ref in refs:
        actor = ref.task_id().actor_id()
        try:
            placed = not actor.is_nil() and bool(state.actors(actor.hex()).get("Pid"))
        except Exception:  # the table is Ray's private API: never let it hide a pending actor
            placed = False
        if not placed:
            out.append(ref)
    return out


def wait_for_actors(
    refs: Mapping[Any, str],
    timeout_s: float,
    demand: dict[str, float],
    poll_s: float = 60.0,
    wait: Callable[..., tuple[list[Any], list[Any]]] | None = None,
    cluster: Callable[[], dict[str, float]] | None = None,
    unplaced: Callable[[list[Any]], list[Any]] | None = None,
) -> None:
    """Wait until every actor has answered its ref in ``refs`` (ref -> the actor's name, e.g. the
    reply of a ``location`` call), logging every ``poll_s``; when some actor is still unplaced
    after ``timeout_s`` raise ``ActorsPending`` naming the unplaced ones and what the cluster
    lacks for ``demand``.

    Ray keeps an actor it cannot place pending forever, and a run that waits forever on one looks
    like a slow start; an autoscaler adds nodes in minutes, so past the time-out nothing will come.
    The time-out counts only polls during which some actor had no node (``unplaced``): a placed
    actor still loading its model is waited for as long as it takes (it answers with its error if
    its ``__init__`` fails). ``wait``, ``cluster`` and ``unplaced`` default to ``ray.wait``,
    ``ray.cluster_resources`` and ``unplaced_actors``; tests pass fakes (with a fake ``wait`` and
    no ``unplaced``, every pending actor counts as unplaced).
    """
    if unplaced is None:
        unplaced = unplaced_actors if wait is None else list
    if wait is None or cluster is None:
        import ray

        wait, cluster = wait or ray.wait, cluster or ray.cluster_resources
    pending, waited = list(refs), 0.0
    while pending:
        homeless = unplaced(pending)
        if homeless and waited >= timeout_s:
            raise ActorsPending(pending_error([refs[r] for r in homeless], waited, demand, dict(cluster())))
        step = min(poll_s, timeout_s - waited) if homeless else poll_s
        _, pending = wait(pending, num_returns=len(pending), timeout=step)
        if homeless:
            waited += step
        if pending and (waited < timeout_s or not homeless):
            log.warning(
                "%d actor(s) not started after %g s of waiting for a node (%s; %s); the run stops "
                "when one has no node after placement.pending_timeout_s=%g",
                len(pending),
                waited,
                ", ".join(refs[ref] for ref in pending),
                "some have no node yet" if homeless else "all placed, loading",
                timeout_s,
            )
