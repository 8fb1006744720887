"""Check, on a live cluster, that env workers land on the nodes that offer a custom resource.

    python launch/submit.py --command "python launch/check_placement.py --resource env_node"

Run it (as a job) after bringing a cluster up and before a long training run: it starts an
env pool (``selective_rollout.envs.pool``) whose workers ask for ``--resource``, plays one step of a group on
each worker, and reports which node every worker ran on. Exit status 1 when a worker ran on a
node without the resource (a mislabelled node group), 2 when no node offers it at all.

The games folder must be readable at the same path from every env node (shared storage or the
same ``ALFWORLD_DATA`` on each node): workers open games by path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from alfworld_env import load_games
from alfworld_env.generate import generate
from selective_rollout.envs.alfworld import AlfworldSource, game_task
from selective_rollout.envs.pool import RayEnvPool
from selective_rollout.records import Task


def resource_nodes(resource: str) -> dict[str, str]:
    """node id -> node IP of the alive nodes that offer ``resource``."""
    return {
        n["NodeID"]: n["NodeManagerAddress"]
        for n in ray.nodes()
        if n["Alive"] and n.get("Resources", {}).get(resource, 0) > 0
    }


def worker_nodes(job_id: str) -> list[dict[str, Any]]:
    """The EnvWorker actors of this job: node id and PID of each (Ray's state API)."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", "EnvWorker"), ("job_id", "=", job_id)])
    return [{"node_id": a.node_id, "pid": a.pid, "state": a.state} for a in actors]


async def play_one_step(pool: RayEnvPool, tasks: Sequence[Task], group_size: int) -> list[str]:
    """Open one group per task (they spread over the workers), step each episode once, close."""
    observations = []
    for task in tasks:
        states = await pool.reset_group(task, group_size)
        stepped = await pool.step({s.episode_id: s.admissible[0] for s in states})
        failed = [s.failed for s in stepped.values() if s.failed]
        if failed:
            raise RuntimeError(f"env step failed on {task.task_id}: {failed[0]}")
        observations.extend(s.obs for s in stepped.values())
        await pool.close(list(stepped))
    return observations


def check(resource: str, workers: int, games_dir: Path, source: str, group_size: int) -> dict[str, Any]:
    offering = resource_nodes(resource)
    if not offering:
        raise LookupError(
            f"no alive Ray node offers the resource {resource!r}: start env nodes with "
            f"`ray start ... --resources='{{\"{resource}\": N}}'`"
        )
    if source == "generated":
        generate(games_dir, "train", workers, preset="tiny", progress=False)
    games = load_games(games_dir, "train", source=source)[:workers]
    pool = RayEnvPool(workers, AlfworldSource(), {"num_cpus": 0, "resources": {resource: 0.01}})
    try:
        observations = asyncio.run(play_one_step(pool, [game_task(g) for g in games], group_size))
        placed = worker_nodes(ray.get_runtime_context().get_job_id())
    finally:
        pool.shutdown()
    misplaced = [w for w in placed if w["node_id"] not in offering]
    return {
        "resource": resource,
        "resource_nodes": offering,
        "workers": placed,
        "misplaced": misplaced,
        "steps": len(observations),
        "ok": len(placed) == workers and not misplaced and len(observations) == len(games) * group_size,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python launch/check_placement.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--resource", default="env_node", help="custom resource of the env nodes")
    p.add_argument("--workers", type=int, default=2, help="env workers to start")
    p.add_argument("--group-size", type=int, default=2, help="episodes per group")
    p.add_argument("--source", choices=["generated", "official"], default="generated")
    p.add_argument("--games-dir", default=None, help="games root (default: a fresh temp folder)")
    p.add_argument("--address", default=None, help="Ray cluster (default: RAY_ADDRESS, set inside a job)")
    args = p.parse_args(argv)
    ray.init(address=args.address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
    games_dir = Path(args.games_dir or tempfile.mkdtemp(prefix="sr-placement-"))
    try:
        report = check(args.resource, args.workers, games_dir, args.source, args.group_size)
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("PLACEMENT " + json.dumps(report, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
