"""Faults a real run meets, injected into real runs: how many it survives and what it loses.

Every scenario runs the training CLI (``python -m selective_rollout.train``) as a child process
on a tiny profile and kills a real process by PID at a real moment, found in the run's own
``placement.json``:

- ``env``: an env worker, once the first group is logged (mid-rollout);
- ``engine``: the rollout engine, the same way;
- ``driver``: the driver itself after its first iteration is logged, then the same command
  again, which resumes;
- ``server``: no kill; poison requests (NaN or denormal temperature, a seed of 2**64, n = 1000,
  max_tokens 0, a prompt over the context) sent beside good ones to ``selective_rollout.integrations.serve``.

It prints one row per scenario: tries survived (the run finished, exit 0), groups lost (a failed
group never retried), records duplicated (a group id or a metrics iteration logged twice) and
requests left unanswered. Everything is ended by PID (never ``ray stop``).

    python bench/faults.py [--tries 1] [--only env,engine,driver,server]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from selective_rollout.records import Outcome, read_groups
from selective_rollout.reporting.metrics_log import read_metrics

TINY = [
    "env.n_train=6",
    "env.n_valid=2",
    "env.num_workers=2",
    "rollout.group_size=2",
    "rollout.groups_per_iteration=2",
    "rollout.max_groups_in_flight=2",
    "rollout.max_steps=4",
    "rollout.strategy=none",
    "engine.temperature=1.0",
    "warm_start.enabled=false",
    "eval.num_tasks=1",
    "trainer.save_every=1",  # a killed driver resumes from the iteration before
    "logging.progress=false",
]


@dataclass
class Row:
    scenario: str
    tries: int = 0
    survived: int = 0
    lost: int = 0
    duplicated: int = 0
    unanswered: int = 0
    notes: list[str] = field(default_factory=list)


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"gave up waiting for {what} after {timeout_s:.0f} s")


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.is_file() else 0


class Run:
    """One training CLI child; remembers its whole process tree so that all of it can be ended."""

    def __init__(self, games: Path, run_dir: Path, iterations: int) -> None:
        cmd = [sys.executable, "-m", "selective_rollout.train", "--config", "configs/cpu_default.yaml"]
        cmd += [f"env.games_dir={games}", *TINY, f"driver.iterations={iterations}"]
        cmd += [f"driver.run_dir={run_dir}"]
        self.run_dir, self.tree = run_dir, set()
        self.log = (run_dir.parent / f"{run_dir.name}.log").open("a")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def remember_tree(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            self.tree |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}

    def placement(self) -> dict:
        path = self.run_dir / "placement.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def finish(self, timeout_s: float = 900) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.end()

    def end(self) -> None:
        """End the child and whatever of its tree is left (a SIGKILLed driver orphans its Ray)."""
        self.remember_tree()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        self.log.close()


def _account(row: Row, run_dir: Path) -> None:
    """Groups lost and records duplicated in a finished run folder."""
    groups = list(read_groups(run_dir / "rollouts.jsonl"))
    ids = Counter(g.group_id for g in groups)
    iterations = Counter(m["iteration"] for m in read_metrics(run_dir / "metrics.jsonl"))
    row.duplicated += sum(n - 1 for n in ids.values() if n > 1) + sum(
        n - 1 for n in iterations.values() if n > 1
    )
    for g in groups:
        if g.outcome is Outcome.FAILED:
            later = [
                h for h in groups if h.task_id == g.task_id and h.iteration == g.iteration and h is not g
            ]
            row.lost += not later
            row.notes.append(str(g.meta.get("failure", ""))[:80])


def kill_actor(row: Row, games: Path, root: Path, kind: str) -> None:
    run = Run(games, root / f"{kind}-{row.tries}", iterations=1)
    try:
        _wait_for(lambda: bool(run.placement().get(kind)), 300, f"placement.json ({kind})")
        run.remember_tree()
        _wait_for(lambda: _lines(run.run_dir / "rollouts.jsonl") >= 1, 600, "the first logged group")
        victim = int(run.placement()[kind][0]["pid"])
        os.kill(victim, signal.SIGKILL)
        code = run.finish()
    finally:
        run.end()
    row.survived += code == 0
    if code == 0:
        _account(row, run.run_dir)
        metrics = read_metrics(run.run_dir / "metrics.jsonl")
        key = "env/restarts" if kind == "env_workers" else "system/engine_restarts"
        row.notes.append(f"{key}={max(m.get(key) or 0 for m in metrics):g}")


def kill_driver(row: Row, games: Path, root: Path) -> None:
    run_dir = root / f"driver-{row.tries}"
    first = Run(games, run_dir, iterations=2)
    try:
        _wait_for(lambda: bool(first.placement()), 300, "placement.json")
        first.remember_tree()
        _wait_for(
            lambda: any(m.get("iteration") == 0 for m in _metrics_or_empty(run_dir)),
            900,
            "iteration 0 logged",
        )
        first.remember_tree()
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
    finally:
        first.end()
    code = Run(games, run_dir, iterations=2).finish()
    row.survived += code == 0
    if code == 0:
        _account(row, run_dir)
        report = json.loads((run_dir / "report.json").read_text())
        row.notes.append(f"resumed; report counts {report['rollout']['groups']} groups")


def _metrics_or_empty(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


POISON = [
    '"temperature": NaN',
    '"temperature": 1e-45',
    '"seed": 18446744073709551616',
    '"n": 1000',
    '"max_tokens": 0',
    '"top_p": NaN',
    '"n": 0',
    '"seed": -1',
]


async def _server_round(url: str, row: Row) -> None:
    import httpx

    long_prompt = "word " * 9000
    bodies = [
        '{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, ' + p + "}" for p in POISON
    ]
    bodies.append('{"messages": [{"role": "user", "content": "' + long_prompt + '"}], "max_tokens": 4}')
    good = '{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}'
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url + "/", timeout=120) as c:
        calls = [c.post("chat/completions", content=b, headers=headers) for b in [*bodies, good, good, good]]
        answers = await asyncio.gather(*calls, return_exceptions=True)
    bad, ok = answers[: len(bodies)], answers[len(bodies) :]
    row.unanswered += sum(isinstance(a, Exception) for a in answers)
    row.survived += all(not isinstance(a, Exception) and a.status_code == 200 for a in ok)
    codes = Counter(a.status_code for a in bad if not isinstance(a, Exception))
    row.notes.append("poison -> " + ", ".join(f"{n}x {code}" for code, n in sorted(codes.items())))


def poison_server(row: Row) -> None:
    from selective_rollout.integrations.serve import serve_subprocess
    from selective_rollout.models import resolve_model

    with serve_subprocess(resolve_model("smollm2-135m-instruct")) as url:
        asyncio.run(_server_round(url, row))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=1)
    ap.add_argument("--only", default="env,engine,driver,server")
    args = ap.parse_args(argv)
    chosen = args.only.split(",")
    from alfworld_env import ensure_games

    rows = []
    with tempfile.TemporaryDirectory(prefix="sr-faults-") as tmp:
        root = Path(tmp)
        games = ensure_games(root / "games", preset="tiny", n_train=6, n_valid=2, seed=0)
        scenarios: dict[str, Callable[[Row], None]] = {
            "env": lambda r: kill_actor(r, games, root, "env_workers"),
            "engine": lambda r: kill_actor(r, games, root, "engines"),
            "driver": lambda r: kill_driver(r, games, root),
            "server": poison_server,
        }
        for name in chosen:
            row = Row(name)
            for _ in range(args.tries):
                start = time.monotonic()
                try:
                    scenarios[name](row)
                except (TimeoutError, OSError, ValueError) as exc:
                    row.notes.append(f"error: {exc}")
                row.tries += 1
                print(f"  {name} try {row.tries}: {time.monotonic() - start:.0f} s", file=sys.stderr)
            rows.append(row)
    print(f"{'scenario':8} {'survived':>9} {'groups lost':>12} {'duplicated':>11} {'unanswered':>11}  notes")
    for r in rows:
        notes = "; ".join(dict.fromkeys(r.notes))
        counts = f"{r.lost:>12} {r.duplicated:>11} {r.unanswered:>11}"
        print(f"{r.scenario:8} {r.survived:>4} of {r.tries:<2} {counts}  {notes}")
    return (
        0 if all(r.survived == r.tries and not (r.lost or r.duplicated or r.unanswered) for r in rows) else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
