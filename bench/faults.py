"""Faults a real run meets, injected into real runs: how many it survives and what it loses.

Every scenario runs the training CLI (``python -m selective_rollout.train``) as a child process
on a tiny profile (tiny games, two env workers, two groups of G = 2 in flight, so that each
worker serves one) and kills a real process by PID at a real moment, found in the run's own
``placement.json``:

- ``env``: an env worker serving a live episode: once the held-out "before" evaluation is logged
  (the rollout starts next), the first worker whose CPU time then grows (it opened a group's
  episodes) while no group of the rollout has been logged yet;
- ``engine``: the rollout engine, the same way (generating for the rollout);
- ``driver``: the driver itself once its first checkpoint is complete, then the same command
  again, which resumes;
- ``server``: no kill; poison requests (NaN or denormal temperature, a seed of 2**64, n = 1000,
  max_tokens 0, a prompt over the context) sent beside good ones to ``selective_rollout.integrations.serve``.

A try survives when the run finishes (exit 0) and the kill is seen to have landed: the run's
metrics count a replaced env worker (``env/restarts``) or engine (``system/engine_restarts``),
or the driver's second run logs that it resumed from a checkpoint. A kill that did not land fails
the try with a note saying so, since a run that never met the fault proves nothing. A child that
exits before it is killed fails the try at once with its error line.

It prints one row per scenario: tries survived, groups lost (a failed group never retried),
records duplicated (a group id or a metrics iteration logged twice) and requests left
unanswered. Everything is ended by PID (never ``ray stop``).

    python bench/faults.py [--tries 1] [--only env,engine,driver,server] [--pipeline sync] [--tiny]

``--pipeline async`` runs the training scenarios under ``driver.pipeline=async`` (decoupled PPO):
the driver's kill then lands while the next iteration's rollout is in flight, whose groups the
resumed run must play again without logging any twice.

``--tiny`` (what CI runs, tests/bench) plays one try of the env and server scenarios, the runs on
4-step episodes: the engine kill takes the env kill's path through this script, and the driver
kill's two more runs would take minutes that CI does not have.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
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
from _tiny import parse_args

from selective_rollout.analysis.experiment import TINY_RUN
from selective_rollout.learner import latest_checkpoint
from selective_rollout.records import Outcome, read_groups
from selective_rollout.reporting.metrics_log import read_metrics

# The tiny run with two env workers and two groups in flight (least loaded first: one group on
# each worker, so either worker killed mid-rollout holds a live episode), ungated, sampled hot,
# and a checkpoint every iteration (a killed driver resumes from the one before)
FAULTS_RUN = [
    *TINY_RUN,
    "env.num_workers=2",
    "rollout.groups_per_iteration=2",
    "rollout.max_groups_in_flight=2",
    "rollout.strategy=none",
    "engine.temperature=1.0",
    "trainer.save_every=1",
]
# the pipeline's settings (--pipeline)
PIPELINES = {
    "sync": ["driver.pipeline=sync"],
    "async": ["driver.pipeline=async", "trainer.policy_loss=decoupled_ppo"],
}
# --tiny: 4-step episodes (the gate is off, so no gate step bounds them)
TINY_EPISODES = ["rollout.max_steps=4"]
# CPU seconds a process must spend after the rollout starts to count as serving it: an env
# worker's reset of a group's episodes costs more; an idle Ray worker's own threads far less
BUSY_CPU_S = 0.1
# The line the driver logs once the held-out "before" evaluation is done; the rollout starts next
BEFORE_EVALUATED = "held-out (before):"
METRIC_OF = {"env_workers": "env/restarts", "engines": "system/engine_restarts"}


@dataclass
class Row:
    scenario: str
    tries: int = 0
    survived: int = 0
    lost: int = 0
    duplicated: int = 0
    unanswered: int = 0
    notes: list[str] = field(default_factory=list)


class ChildExited(RuntimeError):
    """The training child ended on its own before the fault could be injected."""


class Run:
    """One training CLI child; remembers its whole process tree so that all of it can be ended."""

    def __init__(self, games: Path, run_dir: Path, iterations: int, extra: list[str]) -> None:
        cmd = [sys.executable, "-m", "selective_rollout.train", "--config", "configs/cpu_default.yaml"]
        cmd += [f"env.games_dir={games}", *FAULTS_RUN, *extra, f"driver.iterations={iterations}"]
        cmd += [f"driver.run_dir={run_dir}"]
        self.run_dir, self.tree = run_dir, set()
        self.log_path = run_dir.parent / f"{run_dir.name}.log"
        self.log_from = self.log_path.stat().st_size if self.log_path.is_file() else 0
        self.log = self.log_path.open("a")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        """What this child has printed (stdout and stderr) so far."""
        with self.log_path.open() as fh:
            fh.seek(self.log_from)
            return fh.read()

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``condition`` until it holds; a child that exits first is an error naming its
        own last error line, not a wait until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return
            if (code := self.proc.poll()) is not None:
                raise ChildExited(f"the run exited ({code}) before {what}: {error_line(self.output())}")
            time.sleep(0.1)
        raise TimeoutError(f"gave up waiting for {what} after {timeout_s:.0f} s")

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


def error_line(output: str) -> str:
    """The line of a child's output that says why it stopped: its last ``error:`` line or
    exception, else its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:") or re.match(r"^\w+(Error|Exception)\b", ln)]
    return (errors or lines or ["(no output)"])[-1]


def _cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has spent so far (0 once it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


def kill_in_rollout(run: Run, kind: str) -> int:
    """SIGKILL the first ``kind`` process (``placement.json``) seen working for the rollout: its
    CPU time grew by ``BUSY_CPU_S`` since a moment before the held-out "before" evaluation was
    logged (the rollout starts after it), and no group has been logged yet, so that it holds a
    group in flight. Returns its PID."""
    run.wait_for(lambda: bool(run.placement().get(kind)), 300, f"placement.json ({kind})")
    run.remember_tree()
    pids = [int(loc["pid"]) for loc in run.placement()[kind]]
    since = {pid: _cpu_s(pid) for pid in pids}

    def evaluated() -> bool:
        # read before the log: while the line is absent, these times predate the rollout
        now = {pid: _cpu_s(pid) for pid in pids}
        if BEFORE_EVALUATED in run.output():
            return True
        since.update(now)
        return False

    busy: list[int] = []

    def one_busy() -> bool:
        busy.extend(pid for pid in pids if _cpu_s(pid) - since[pid] >= BUSY_CPU_S)
        if not busy and _lines(run.run_dir / "rollouts.jsonl"):
            raise TimeoutError(f"a group was logged before any of {kind} {pids} was seen busy")
        return bool(busy)

    run.wait_for(evaluated, 600, "the held-out 'before' evaluation")
    run.wait_for(one_busy, 600, f"one of {kind} {pids} serving the rollout")
    os.kill(busy[0], signal.SIGKILL)
    return busy[0]


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.is_file() else 0


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


def kill_actor(row: Row, games: Path, root: Path, kind: str, extra: list[str]) -> None:
    """Kill an env worker or the engine mid-rollout; the run must finish and count the restart."""
    run = Run(games, root / f"{kind}-{row.tries}", 1, extra)
    try:
        victim = kill_in_rollout(run, kind)
        code = run.finish()
    finally:
        run.end()
    if code != 0:
        row.notes.append(f"exit {code}: {error_line(run.output())}")
        return
    _account(row, run.run_dir)
    key = METRIC_OF[kind]
    restarts = max(m.get(key) or 0 for m in read_metrics(run.run_dir / "metrics.jsonl"))
    if restarts < 1:
        row.notes.append(f"the kill did not land: {key}=0 after PID {victim} was killed")
        return
    row.survived += 1
    row.notes.append(f"{key}={restarts:g}")


def kill_driver(row: Row, games: Path, root: Path, extra: list[str]) -> None:
    """Kill the driver once its first checkpoint is complete; the same command again must resume
    from it and finish."""
    run_dir = root / f"driver-{row.tries}"
    first = Run(games, run_dir, 2, extra)
    try:
        first.wait_for(lambda: bool(first.placement()), 300, "placement.json")
        first.remember_tree()
        first.wait_for(
            lambda: latest_checkpoint(run_dir / "checkpoints") is not None, 900, "the first checkpoint"
        )
        first.remember_tree()
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
    finally:
        first.end()
    second = Run(games, run_dir, 2, extra)
    code = second.finish()
    if code != 0:
        row.notes.append(f"exit {code}: {error_line(second.output())}")
        return
    _account(row, run_dir)
    resumed = re.search(r"resumed at iteration (\d+)", second.output())
    if resumed is None:
        row.notes.append("the kill did not land: the second run did not resume from a checkpoint")
        return
    row.survived += 1
    report = json.loads((run_dir / "report.json").read_text())
    row.notes.append(f"resumed at iteration {resumed[1]}; report counts {report['rollout']['groups']} groups")


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
    ap.add_argument(
        "--pipeline", choices=sorted(PIPELINES), default="sync", help="driver.pipeline of the runs"
    )
    args = parse_args(ap, argv, only="env,server")
    extra = [*PIPELINES[args.pipeline], *(TINY_EPISODES if args.tiny else [])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sr-faults-") as tmp:
        root = Path(tmp)
        games = root / "games"  # generated by the first run (env.generate)
        scenarios: dict[str, Callable[[Row], None]] = {
            "env": lambda r: kill_actor(r, games, root, "env_workers", extra),
            "engine": lambda r: kill_actor(r, games, root, "engines", extra),
            "driver": lambda r: kill_driver(r, games, root, extra),
            "server": poison_server,
        }
        for name in args.only.split(","):
            row = Row(name)
            for _ in range(args.tries):
                start = time.monotonic()
                try:
                    scenarios[name](row)
                except (TimeoutError, OSError, ValueError, ChildExited) as exc:
                    row.notes.append(f"error: {exc}")
                row.tries += 1
                print(f"  {name} try {row.tries}: {time.monotonic() - start:.0f} s", file=sys.stderr)
            rows.append(row)
    print(f"pipeline: {args.pipeline}")
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
