#!/usr/bin/env python3
"""Does the GPU stack install where it will run? Resolve it with uv, for Linux x86_64, from here.

    python launch/check_gpu_stack.py [--out DIR] [--pyproject FILE] [--uv PATH]

Why: no development or CI machine has a GPU, so ``pip install -e ".[gpu]"`` only ever runs on a
cluster node or inside ``docker build -f docker/Dockerfile``. A pin that vLLM's own requirements
exclude (numpy 2.4 against mistral_common's numpy<2.4 on Python <= 3.12) or a dependency PyPI has
no wheel for (pip then builds it from source, and the image lacks the compiler) is found there,
late and far from the change that caused it. uv resolves a set for another platform and Python
from the index's metadata alone: no CUDA wheel is downloaded and nothing is built, so this runs in
seconds on any machine that reaches PyPI.

Two checks, one line per problem, exit status 1 if there is any:

1. The base dependencies + the ``gpu`` extra resolve for Linux x86_64 (``--platform``, default
   manylinux_2_28: the oldest glibc the torch and vLLM wheels install on) on every Python minor that
   pyproject.toml's requires-python admits. Each set is written as a PEP 751 ``pylock.pyXY.toml``
   into ``--out``; its key pins are printed.
2. Each image (docker/Dockerfile, docker/Dockerfile.cpu) is resolved as that image installs it: its
   Python, the manylinux tag of its distribution's glibc, the extras its ``pip install .[...]``
   names. Every package with no wheel for that platform is built from its sdist in the image, so
   docker/build_tools.toml must say which Debian packages its build needs (an unknown one fails,
   named) and the Dockerfile's ``apt-get install`` must hold them (a missing one fails, named).

The reading and comparing (pylock, Dockerfile, map) are plain functions without network, tested
offline in tests/launch/test_gpu_stack.py; only :func:`compile_lock` runs uv.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dockerfile_parse import DockerfileParser
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = (REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.cpu")
BUILD_TOOLS = REPO / "docker" / "build_tools.toml"
# torch 2.13.0 and vLLM 0.32.0 ship manylinux_2_28 wheels: a GPU node with an older glibc cannot
# install them at all, so that tag is the node this check stands for.
DEFAULT_PLATFORM = "x86_64-manylinux_2_28"
KEY_PACKAGES = ("torch", "vllm", "numpy", "transformers", "deepspeed", "ray")
# Python 3 minors considered when reading requires-python (a range must close below the last one).
PYTHON_MINORS = range(6, 30)
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
# apt-get options that take a value (the value is not a package).
APT_VALUE_OPTIONS = {"-o", "--option", "-c", "--config-file", "-t", "--target-release"}
_PROJECT_REF = re.compile(r"^\.(/)?(\[(?P<extras>[^\]]*)\])?$")


class CheckError(Exception):
    """A problem the check reports as one line (its message)."""


@dataclass(frozen=True)
class Distro:
    """What an image's base distribution fixes: its glibc (which manylinux wheels install) and the
    Python its ``python3`` package installs."""

    glibc: str
    python: str


# Base images name their distribution in the tag (nvidia/cuda:...-ubuntu24.04, python:...-bookworm).
# A base on a distribution missing here fails the check: add its glibc and python3 version.
DISTROS = {
    "ubuntu22.04": Distro(glibc="2.35", python="3.10"),
    "ubuntu24.04": Distro(glibc="2.39", python="3.12"),
    "bullseye": Distro(glibc="2.31", python="3.9"),
    "bookworm": Distro(glibc="2.36", python="3.11"),
    "trixie": Distro(glibc="2.41", python="3.13"),
}


@dataclass(frozen=True)
class LockedPackage:
    """One ``[[packages]]`` entry of a pylock.toml: whether pip can install it without a build."""

    name: str  # canonical (PEP 503)
    version: str
    has_wheel: bool


@dataclass(frozen=True)
class BuildNeeds:
    """One entry of docker/build_tools.toml: the Debian packages a source build needs, and why."""

    apt: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ImageTarget:
    """What one Dockerfile installs the project for."""

    dockerfile: str  # as printed, relative to the repository
    python: str  # "3.12"
    platform: str  # uv's --python-platform, e.g. "x86_64-manylinux_2_39"
    extras: frozenset[str]
    apt: frozenset[str]


@dataclass(frozen=True)
class Resolution:
    """One set to resolve: the project's extras for one Python on one platform."""

    label: str
    python: str
    platform: str
    extras: frozenset[str]
    lock: Path


# --- pure logic (no network) -------------------------------------------------------------------


def admitted_minors(requires_python: str) -> list[str]:
    """The Python minors ("3.11", ...) requires-python admits. It must have an upper bound: the
    check resolves every admitted minor, and an open range would include ones not yet released."""
    spec = SpecifierSet(requires_python)
    if spec.contains(f"3.{PYTHON_MINORS[-1]}.0"):
        raise CheckError(f"requires-python {requires_python!r} has no upper bound; close it (e.g. <3.13)")
    minors = [f"3.{m}" for m in PYTHON_MINORS if spec.contains(f"3.{m}.0") or spec.contains(f"3.{m}.99")]
    if not minors:
        raise CheckError(f"requires-python {requires_python!r} admits no Python 3 minor")
    return minors


def read_pylock(text: str) -> list[LockedPackage]:
    """The packages of a PEP 751 lock. uv writes, for a ``--python-platform`` resolution, only the
    wheels that install on that platform: an entry without one is built from source there."""
    data = tomllib.loads(text)
    packages = []
    for entry in data.get("packages", []):
        archive = entry.get("archive") or {}
        has_wheel = bool(entry.get("wheels")) or str(archive.get("url", archive.get("path", ""))).endswith(
            ".whl"
        )
        packages.append(LockedPackage(canonicalize_name(entry["name"]), str(entry["version"]), has_wheel))
    return packages


def source_builds(packages: list[LockedPackage]) -> list[LockedPackage]:
    """The packages pip must build from their sdist (no wheel fits the platform), sorted by name."""
    return sorted((p for p in packages if not p.has_wheel), key=lambda p: p.name)


def key_pins(packages: list[LockedPackage], names: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str | None]:
    """The version of each key package (None where the set does not hold it)."""
    versions = {p.name: p.version for p in packages}
    return {name: versions.get(canonicalize_name(name)) for name in names}


def load_build_tools(text: str, source: str = "docker/build_tools.toml") -> dict[str, BuildNeeds]:
    """Read the map package -> BuildNeeds, refusing entries that would make the check vacuous (no
    reason, apt not a list of names)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CheckError(f"{source}: not TOML: {exc}") from None
    needs = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or set(entry) != {"apt", "reason"}:
            raise CheckError(f'{source}: [{name}] must hold exactly `apt = [...]` and `reason = "..."`')
        apt, reason = entry["apt"], entry["reason"]
        if not isinstance(apt, list) or not all(isinstance(a, str) and a.strip() for a in apt):
            raise CheckError(f"{source}: [{name}] apt must be a list of Debian package names")
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
            raise CheckError(f"{source}: [{name}] needs a one-line reason")
        needs[canonicalize_name(name)] = BuildNeeds(tuple(apt), reason.strip())
    return needs


def parse_dockerfile(text: str) -> DockerfileParser:
    # From a file object: the parser takes a path only when the file is named plain "Dockerfile".
    return DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)


def _run_commands(dockerfile: DockerfileParser) -> list[list[str]]:
    """Every simple shell command of every RUN instruction, as its argument list."""
    commands: list[list[str]] = []
    for instr in dockerfile.structure:
        if instr["instruction"] != "RUN":
            continue
        value = instr["value"].strip()
        if value.startswith("["):  # exec form: one command, no shell
            commands.append([str(a) for a in json.loads(value)])
            continue
        lexer = shlex.shlex(value, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for tok in [*lexer, ";"]:
            if tok in SHELL_OPERATORS:
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(tok)
    return commands


def _strip_prefix(cmd: list[str]) -> list[str]:
    """A command without leading VAR=value assignments and sudo/env."""
    i = 0
    while i < len(cmd) and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd[i]) or cmd[i] in {"sudo", "env"}):
        i += 1
    return cmd[i:]


def apt_installs(dockerfile_text: str) -> set[str]:
    """The Debian packages the Dockerfile's ``apt-get install`` / ``apt install`` commands name
    (version pins and architecture suffixes dropped)."""
    found: set[str] = set()
    for cmd in map(_strip_prefix, _run_commands(parse_dockerfile(dockerfile_text))):
        if not cmd or Path(cmd[0]).name not in {"apt-get", "apt"} or "install" not in cmd:
            continue
        skip = False
        for arg in cmd[cmd.index("install") + 1 :]:
            if skip:
                skip = False
            elif arg in APT_VALUE_OPTIONS:
                skip = True
            elif not arg.startswith("-"):
                found.add(re.split(r"[=:]", arg, maxsplit=1)[0])
    return found


def project_extras(dockerfile_text: str) -> frozenset[str] | None:
    """The extras of the project's own ``pip install .[...]`` (union over all of them); None when
    the Dockerfile never pip-installs the project."""
    extras: set[str] | None = None
    for cmd in map(_strip_prefix, _run_commands(parse_dockerfile(dockerfile_text))):
        for i in range(len(cmd) - 1):
            if Path(cmd[i]).name in {"pip", "pip3"} and cmd[i + 1] == "install":
                for arg in cmd[i + 2 :]:
                    if m := _PROJECT_REF.match(arg):
                        extras = extras or set()
                        extras |= {e.strip() for e in (m.group("extras") or "").split(",") if e.strip()}
                break
    return None if extras is None else frozenset(extras)


def image_target(dockerfile_text: str, dockerfile: str) -> ImageTarget:
    """Python, platform and extras of the image a Dockerfile builds, from its FROM line (the
    distribution in the tag; the Python in a ``python:X.Y`` tag, else the distribution's python3)."""
    parsed = parse_dockerfile(dockerfile_text)
    base = parsed.baseimage or ""
    repo, _, tag = base.rpartition(":")
    distro = next((d for key, d in DISTROS.items() if key in tag), None)
    if distro is None:
        raise CheckError(f"{dockerfile}: FROM {base}: unknown distribution; add it to DISTROS here")
    apt = apt_installs(dockerfile_text)
    if repo.rsplit("/", 1)[-1] == "python":
        m = re.match(r"(\d+\.\d+)", tag)
        if not m:
            raise CheckError(f"{dockerfile}: FROM {base}: no Python version in the tag")
        python = m.group(1)
    elif "python3" in apt:
        python = distro.python
    else:
        raise CheckError(f"{dockerfile}: FROM {base}: neither a python image nor an apt-get install python3")
    extras = project_extras(dockerfile_text)
    if extras is None:
        raise CheckError(f"{dockerfile}: the project is never pip-installed (pip install .[...])")
    platform = "x86_64-manylinux_" + distro.glibc.replace(".", "_")
    return ImageTarget(dockerfile, python, platform, extras, frozenset(apt))


def build_tool_errors(
    target: ImageTarget,
    builds: list[LockedPackage],
    needs: dict[str, BuildNeeds],
    map_name: str = "docker/build_tools.toml",
) -> list[str]:
    """One line per source build the image cannot do: a package the map does not know, or a Debian
    package the map says it needs and the Dockerfile's apt-get install lacks."""
    errors = []
    for pkg in builds:
        if pkg.name not in needs:
            errors.append(
                f"{target.dockerfile}: {pkg.name} {pkg.version} has no wheel for {target.platform} and is "
                f"not in {map_name}: add the Debian packages its source build needs"
            )
            continue
        for tool in needs[pkg.name].apt:
            if tool not in target.apt:
                errors.append(
                    f"{target.dockerfile}: {pkg.name} {pkg.version} builds from source and needs {tool}, "
                    f"which its apt-get install lacks ({needs[pkg.name].reason})"
                )
    return errors


def one_line(uv_stderr: str) -> str:
    """uv's resolver explanation on one line (it prints a multi-line derivation)."""
    lines = []
    for line in uv_stderr.splitlines():
        line = re.sub(r"^[\s×╰─▶│]*", "", line).strip()
        line = re.sub(r"^(error|cause|hint):\s*", "", line)
        if line:
            lines.append(line)
    if not lines:
        return "uv failed without a message"
    return lines[0].rstrip(":") + (": " + " ".join(lines[1:]) if lines[1:] else "")


def format_pins(pins: dict[str, str | None]) -> str:
    return ", ".join(f"{name} {version or '-'}" for name, version in pins.items())


def format_extras(extras: frozenset[str]) -> str:
    return " + ".join(["base", *sorted(extras)])


# --- uv (network) ------------------------------------------------------------------------------


def find_uv(explicit: str | None = None) -> str:
    """uv next to this Python (the venv's pinned one, from the dev extra), else the one on PATH."""
    if explicit:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            raise CheckError(f"uv not found at {explicit}")
        return explicit
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("uv")
    if on_path:
        return on_path
    raise CheckError(
        f"uv not found next to {sys.executable} or on PATH: install the dev extra (make install) or pass --uv"
    )


def compile_lock(uv: str, pyproject: Path, res: Resolution) -> list[LockedPackage]:
    """Resolve one set with ``uv pip compile`` into ``res.lock``. uv resolves for the target
    platform and Python from metadata only; the running interpreter is given so uv never looks for
    (or downloads) another one."""
    res.lock.unlink(missing_ok=True)  # uv would take an existing lock's pins as preferences
    cmd = [uv, "pip", "compile", str(pyproject), "--quiet", "--no-header"]
    for extra in sorted(res.extras):
        cmd += ["--extra", extra]
    cmd += ["--python-platform", res.platform, "--python-version", res.python]
    cmd += ["--python", sys.executable, "-o", str(res.lock)]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0 or not res.lock.is_file():
        raise CheckError(f"{res.label} does not resolve: {one_line(proc.stderr or proc.stdout)}")
    return read_pylock(res.lock.read_text())


# --- command line ------------------------------------------------------------------------------


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def run_checks(args: argparse.Namespace, out: Path) -> list[str]:
    """Resolve every set (concurrently: uv waits on the index, not on the CPU) and compare."""
    pyproject = Path(args.pyproject).resolve()
    requires_python = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    needs = load_build_tools(Path(args.build_tools).read_text(), _relative(Path(args.build_tools)))
    uv = find_uv(args.uv)
    print(f"uv: {uv}; requires-python {requires_python}; locks in {out}")

    jobs: list[tuple[Resolution, ImageTarget | None]] = []
    for minor in admitted_minors(requires_python):
        label = f"Python {minor} ({args.platform}, base + gpu)"
        lock = out / f"pylock.py{minor.replace('.', '')}.toml"
        jobs.append((Resolution(label, minor, args.platform, frozenset({"gpu"}), lock), None))
    for path in DOCKERFILES:
        target = image_target(path.read_text(), _relative(path))
        label = (
            f"{target.dockerfile} (Python {target.python}, {target.platform}, {format_extras(target.extras)})"
        )
        slug = re.sub(r"[^a-z0-9]+", "-", path.name.lower())
        lock = out / f"pylock.image-{slug}.toml"
        jobs.append((Resolution(label, target.python, target.platform, target.extras, lock), target))

    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(compile_lock, uv, pyproject, res) for res, _ in jobs]
        for (res, target), future in zip(jobs, futures, strict=True):
            try:
                packages = future.result()
            except CheckError as exc:
                errors.append(str(exc))
                continue
            builds = source_builds(packages)
            print(f"{res.label}: {format_pins(key_pins(packages))} ({len(packages)} packages)")
            built = ", ".join(f"{p.name} {p.version}" for p in builds) or "none"
            print(f"    no wheel, built from source: {built}")
            if target is not None:
                image_errors = build_tool_errors(target, builds, needs, _relative(Path(args.build_tools)))
                errors += image_errors
                if builds and not image_errors:
                    print("    its apt-get install holds what docker/build_tools.toml says they need")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the pylock.*.toml files (default: a new temp folder)")
    parser.add_argument("--pyproject", default=str(REPO / "pyproject.toml"), help="the project to resolve")
    parser.add_argument("--build-tools", default=str(BUILD_TOOLS), help="package -> Debian build packages")
    parser.add_argument("--platform", default=DEFAULT_PLATFORM, help="uv --python-platform for each Python")
    parser.add_argument("--uv", help="the uv binary (default: next to this Python, else on PATH)")
    args = parser.parse_args(argv)

    start = time.monotonic()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu-stack-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        errors = run_checks(args, out)
    except CheckError as exc:
        errors = [str(exc)]
    elapsed = time.monotonic() - start
    for error in errors:
        print(f"check_gpu_stack: FAIL: {error}", file=sys.stderr)
    if errors:
        print(f"check_gpu_stack: {len(errors)} problem(s) ({elapsed:.1f} s)", file=sys.stderr)
        return 1
    print(f"check_gpu_stack: OK ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
