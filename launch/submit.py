"""Submit a training run (or any command) to a Ray cluster as a Ray job.

    python launch/submit.py [--address http://HEAD:8265] [--env KEY=VALUE ...] [--no-wait] \\
        -- --config configs/cpu_default.yaml gate.k=10

Everything after ``--`` goes to ``python -m selective_rollout.train`` (its ``--config`` and dotted
overrides), plus ``driver.runs_dir=<--runs-dir>`` unless they name the run folder themselves.
``--command`` replaces the whole entrypoint instead (a smoke test, the placement check, an
evaluation).

Why a wrapper rather than bare ``ray job submit``: the runtime env must carry the checkout (the
cluster's image may hold an older copy of the package), must leave out the multi-GB virtualenvs,
data and run folders that sit inside it, and must forward the variables that decide where the
job reads and writes (``WANDB_*``, ``ALFWORLD_DATA``, ``HF_HOME``...). Getting that right by
hand on every submission is where runs go wrong.

The address is the dashboard's HTTP address (``--address`` or ``RAY_ADDRESS``). Inside the job
Ray sets ``RAY_ADDRESS`` to the cluster, so the driver joins it instead of starting its own.
Exit status: 0 when the job SUCCEEDED (or was submitted with ``--no-wait``), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Variables a run reads from its environment; forwarded when set where the wrapper runs.
FORWARDED_PREFIXES = ("WANDB_", "SR_")
FORWARDED_NAMES = (
    "ALFWORLD_DATA",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "VLLM_USE_V1",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "GLOO_SOCKET_IFNAME",
)
# Left out of the uploaded working dir on top of its .gitignore (a checkout without one, or a
# tarball, must not upload a virtualenv: Ray refuses packages over its size limit anyway).
WORKING_DIR_EXCLUDES = (
    ".git",
    ".venv",
    ".venv-*",
    "data",
    "runs",
    "wandb",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
)
# Secrets never travel in the job's runtime env: it is job metadata, readable by anyone who
# reaches the dashboard's job API. Nodes get them from their own environment or a file
# (docs/cluster.md, "Secrets").
_SECRET = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
TRAIN_MODULE = "selective_rollout.train"
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SubmitError(ValueError):
    """A bad argument to the wrapper (named in the message)."""


def forwarded_env(environ: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The job's env vars: the known run variables set here, then ``KEY=VALUE`` items (which win).

    Secret-looking names (``WANDB_API_KEY``, ``*_TOKEN``, ...) are left out, with a note on
    stderr, and refused as ``--env`` items.
    """
    env = {}
    for key, value in environ.items():
        if not (key.startswith(FORWARDED_PREFIXES) or key in FORWARDED_NAMES):
            continue
        if _SECRET.search(key):
            print(f"note: {key} is set here but not forwarded: {_SECRET_ADVICE}", file=sys.stderr)
            continue
        env[key] = value
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise SubmitError(f"--env {item!r} is not of the form NAME=VALUE")
        if _SECRET.search(key):
            raise SubmitError(f"--env {key}: {_SECRET_ADVICE}")
        env[key] = value
    return env


_SECRET_ADVICE = (
    "secrets are not put into the job's metadata, which the dashboard's job API shows to anyone who "
    "reaches it; set it in the environment of the cluster's nodes (or `wandb login` on a shared home), "
    "see docs/cluster.md, Secrets"
)


def train_entrypoint(driver_args: Sequence[str] = (), python: str = "python") -> str:
    """The shell command the job runs: the driver with ``driver_args`` (quoted for the shell)."""
    return shlex.join([python, "-m", TRAIN_MODULE, *driver_args])


def with_runs_dir(driver_args: Sequence[str], runs_dir: str) -> list[str]:
    """The driver's arguments with ``driver.runs_dir=runs_dir`` added, unless they set
    ``driver.runs_dir`` or ``driver.run_dir`` (or their old spelling under ``train.``, still read)
    or ``runs_dir`` is empty. The job runs in Ray's copy of the checkout, which goes with the job:
    a relative ``runs/`` would land there and vanish."""
    named = ("driver.runs_dir=", "driver.run_dir=", "train.runs_dir=", "train.run_dir=")
    if not runs_dir or any(a.startswith(named) for a in driver_args):
        return list(driver_args)
    return [*driver_args, f"driver.runs_dir={runs_dir}"]


def runtime_env(
    working_dir: str | Path | None,
    env_vars: Mapping[str, str],
    excludes: Sequence[str] = WORKING_DIR_EXCLUDES,
) -> dict[str, Any]:
    """Ray runtime env: the checkout as working dir (uploaded, minus ``excludes``) plus env vars."""
    env: dict[str, Any] = {"env_vars": dict(env_vars)}
    if working_dir is not None:
        path = Path(working_dir).resolve()
        if not path.is_dir():
            raise SubmitError(f"--working-dir {working_dir} is not a directory")
        env["working_dir"] = str(path)
        env["excludes"] = list(excludes)
    return env


def _parse_resources(text: str | None) -> dict[str, float] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmitError(f"--entrypoint-resources is not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, int | float) for v in value.values()):
        raise SubmitError(f"--entrypoint-resources must be a JSON object of numbers, got {text!r}")
    return {str(k): float(v) for k, v in value.items()}


async def _stream_logs(client: Any, job_id: str) -> None:
    async for chunk in client.tail_job_logs(job_id):
        sys.stdout.write(chunk)
        sys.stdout.flush()


def wait_for_job(client: Any, job_id: str, follow: bool, timeout_s: float | None) -> str:
    """Block until the job ends (streaming its logs when ``follow``); return its final status."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if follow:
        with contextlib.suppress(TimeoutError):
            asyncio.run(asyncio.wait_for(_stream_logs(client, job_id), timeout_s))
    while True:
        status = str(client.get_job_status(job_id).value)
        if status in TERMINAL or (deadline is not None and time.monotonic() > deadline):
            return status
        time.sleep(1.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python launch/submit.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--address", default=None, help="dashboard URL http://HEAD:8265 (default: RAY_ADDRESS)")
    p.add_argument("--working-dir", default=".", help="uploaded as the job's working dir (default: .)")
    p.add_argument("--no-working-dir", action="store_true", help="run the package installed in the image")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra job env var")
    p.add_argument("--python", default="python", help="interpreter on the cluster (default: python)")
    p.add_argument(
        "--runs-dir",
        default=None,
        help="the run's parent folder as the driver's node sees it (default: runs/ of --working-dir, "
        "right when submitting on the head; a shared filesystem on a multi-node cluster; '' keeps "
        "the config's)",
    )
    p.add_argument("--command", default=None, help="run this shell command instead of the driver")
    p.add_argument("--submission-id", default=None, help="job id (default: Ray picks one)")
    p.add_argument("--entrypoint-num-cpus", type=float, default=None, help="CPUs reserved for the driver")
    p.add_argument("--entrypoint-num-gpus", type=float, default=None, help="GPUs reserved for the driver")
    p.add_argument("--entrypoint-resources", default=None, help="custom resources, JSON: '{\"head\": 1}'")
    p.add_argument("--no-wait", action="store_true", help="submit and return (follow with `ray job logs -f`)")
    p.add_argument("--quiet", action="store_true", help="wait without streaming the job's logs")
    p.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    driver_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, driver_args = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    try:
        if args.command is not None and driver_args:
            raise SubmitError("--command replaces the driver: it takes no driver arguments after `--`")
        runs_dir = str(Path(args.working_dir).resolve() / "runs") if args.runs_dir is None else args.runs_dir
        entrypoint = args.command or train_entrypoint(with_runs_dir(driver_args, runs_dir), args.python)
        env = runtime_env(
            None if args.no_working_dir else args.working_dir, forwarded_env(os.environ, args.env)
        )
        resources = _parse_resources(args.entrypoint_resources)
    except SubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from ray.job_submission import JobSubmissionClient

    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        print("error: no cluster: pass --address http://HEAD:8265 or set RAY_ADDRESS", file=sys.stderr)
        return 2
    try:
        client = JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(f"error: cannot reach the Ray dashboard at {address}: {exc}", file=sys.stderr)
        return 2
    job_id = client.submit_job(
        entrypoint=entrypoint,
        runtime_env=env,
        submission_id=args.submission_id,
        entrypoint_num_cpus=args.entrypoint_num_cpus,
        entrypoint_num_gpus=args.entrypoint_num_gpus,
        entrypoint_resources=resources,
    )
    print(f"submitted job {job_id} to {address}: {entrypoint}", file=sys.stderr)
    if args.no_wait:
        print(f"follow it with: ray job logs --address {address} -f {job_id}", file=sys.stderr)
        return 0
    try:
        status = wait_for_job(client, job_id, follow=not args.quiet, timeout_s=args.timeout)
    except KeyboardInterrupt:
        print(
            f"\nstopped waiting; the job keeps running. Stop it with: "
            f"ray job stop --address {address} {job_id}",
            file=sys.stderr,
        )
        return 130
    print(f"job {job_id}: {status}", file=sys.stderr)
    return 0 if status == "SUCCEEDED" else 1


if __name__ == "__main__":
    raise SystemExit(main())
