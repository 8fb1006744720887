"""launch/check_gpu_stack.py offline: its reading of locks, Dockerfiles and the build-tools map.

No network: the locks are small PEP 751 texts shaped like the ones ``uv pip compile -o pylock.toml``
writes for one platform (only the wheels that fit it), and the CLI runs against a stand-in uv.
"""

from __future__ import annotations

import stat
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from launch.check_gpu_stack import (
    BuildNeeds,
    CheckError,
    ImageTarget,
    LockedPackage,
    admitted_minors,
    apt_installs,
    build_tool_errors,
    find_uv,
    image_target,
    key_pins,
    load_build_tools,
    main,
    one_line,
    project_extras,
    read_pylock,
    source_builds,
)

REPO = Path(__file__).resolve().parents[2]
GPU_DOCKERFILE = REPO / "docker" / "Dockerfile"
CPU_DOCKERFILE = REPO / "docker" / "Dockerfile.cpu"
BUILD_TOOLS = REPO / "docker" / "build_tools.toml"
# The packages PyPI has no manylinux wheel for in this project's set (as uv resolved it).
SDIST_ONLY = {
    "deepspeed": "0.19.6",
    "fast-downward-textworld": "20.6.4",
    "jericho": "3.3.1",
}
SDIST = 'sdist = {{ url = "https://files.pythonhosted.org/packages/x/{name}-{version}.tar.gz" }}'
WHEEL = 'wheels = [{{ url = "https://files.pythonhosted.org/packages/x/{name}-{version}-{tag}.whl" }}]'


def entry(name: str, version: str, wheel_tag: str | None = None, marker: str | None = None) -> str:
    """One [[packages]] entry: with a wheel when wheel_tag is given, else sdist only."""
    lines = ["[[packages]]", f'name = "{name}"', f'version = "{version}"']
    if marker:
        lines.append(f'marker = "{marker}"')
    lines.append(SDIST.format(name=name, version=version))
    if wheel_tag:
        lines.append(WHEEL.format(name=name.replace("-", "_"), version=version, tag=wheel_tag))
    return "\n".join(lines) + "\n"


def pylock(*entries: str) -> str:
    return 'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.12"\n\n' + "\n".join(entries)


def fixture_lock(tmp_path: Path, *entries: str) -> list[LockedPackage]:
    path = tmp_path / "pylock.fixture.toml"
    path.write_text(pylock(*entries))
    return read_pylock(path.read_text())


def real_needs() -> dict[str, BuildNeeds]:
    return load_build_tools(BUILD_TOOLS.read_text())


def target_of(path: Path) -> ImageTarget:
    return image_target(path.read_text(), path.relative_to(REPO).as_posix())


SDIST_ONLY_ENTRIES = [entry(name, version) for name, version in SDIST_ONLY.items()]
WHEEL_ENTRIES = [
    entry("torch", "2.13.0", "cp312-cp312-manylinux_2_28_x86_64"),
    entry("vllm", "0.32.0", "cp38-abi3-manylinux_2_28_x86_64"),
    entry("numpy", "2.3.5", "cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64"),
    # llguidance ships manylinux_2_31 wheels: on the images' glibc (2.36, 2.39) it is no source build.
    entry("llguidance", "1.7.6", "cp39-abi3-manylinux_2_31_x86_64", marker="platform_machine == 'x86_64'"),
]


# --- reading a lock ----------------------------------------------------------------------------


def test_a_package_with_a_wheel_is_not_flagged(tmp_path: Path) -> None:
    packages = fixture_lock(tmp_path, *WHEEL_ENTRIES, entry("jericho", "3.3.1"))
    assert {p.name for p in packages} == {"torch", "vllm", "numpy", "llguidance", "jericho"}
    assert [p.name for p in source_builds(packages)] == ["jericho"]
    target = target_of(GPU_DOCKERFILE)
    assert build_tool_errors(target, source_builds(fixture_lock(tmp_path, *WHEEL_ENTRIES)), {}) == []


def test_names_are_canonical_and_wheel_archives_count_as_wheels(tmp_path: Path) -> None:
    packages = fixture_lock(
        tmp_path,
        entry("Fast_Downward.TextWorld", "20.6.4"),
        '[[packages]]\nname = "local-wheel"\nversion = "1.0"\n'
        'archive = { url = "https://example.org/local_wheel-1.0-py3-none-any.whl" }\n',
    )
    assert [(p.name, p.has_wheel) for p in packages] == [
        ("fast-downward-textworld", False),
        ("local-wheel", True),
    ]


def test_key_pins_read_the_lock_and_mark_what_is_absent(tmp_path: Path) -> None:
    pins = key_pins(fixture_lock(tmp_path, *WHEEL_ENTRIES, *SDIST_ONLY_ENTRIES))
    assert pins == {
        "torch": "2.13.0",
        "vllm": "0.32.0",
        "numpy": "2.3.5",
        "transformers": None,
        "deepspeed": "0.19.6",
        "ray": None,
    }


# --- the map and the Dockerfiles ---------------------------------------------------------------


def test_the_real_dockerfiles_and_map_pass_against_the_sdist_only_packages(tmp_path: Path) -> None:
    packages = fixture_lock(tmp_path, *WHEEL_ENTRIES, *SDIST_ONLY_ENTRIES)
    builds = source_builds(packages)
    assert {p.name for p in builds} == set(SDIST_ONLY)
    for path in (GPU_DOCKERFILE, CPU_DOCKERFILE):
        assert build_tool_errors(target_of(path), builds, real_needs()) == [], path.name


def test_an_sdist_only_package_missing_from_the_map_fails_naming_it(tmp_path: Path) -> None:
    packages = fixture_lock(tmp_path, *WHEEL_ENTRIES, *SDIST_ONLY_ENTRIES, entry("mystery-ext", "0.1"))
    errors = build_tool_errors(target_of(GPU_DOCKERFILE), source_builds(packages), real_needs())
    assert len(errors) == 1, errors
    assert errors[0].startswith("docker/Dockerfile: mystery-ext 0.1 has no wheel for x86_64-manylinux_2_39")
    assert "not in docker/build_tools.toml" in errors[0]


def test_llguidance_without_a_wheel_would_not_pass_unnoticed(tmp_path: Path) -> None:
    """On manylinux_2_28 (glibc < 2.31) llguidance has no wheel and builds with Rust >= 1.87, which
    no Debian package of the images provides: the map leaves it out, so such a base fails here."""
    packages = fixture_lock(tmp_path, *SDIST_ONLY_ENTRIES, entry("llguidance", "1.7.6"))
    errors = build_tool_errors(target_of(GPU_DOCKERFILE), source_builds(packages), real_needs())
    assert len(errors) == 1 and "llguidance 1.7.6 has no wheel" in errors[0], errors


def test_a_dockerfile_without_cmake_fails_for_fast_downward_textworld(tmp_path: Path) -> None:
    dockerfile = textwrap.dedent(
        """\
        FROM python:3.11.13-slim-bookworm
        RUN apt-get update \\
         && apt-get install -y --no-install-recommends build-essential \\
         && rm -rf /var/lib/apt/lists/*
        RUN pip install .
        """
    )
    (tmp_path / "Dockerfile").write_text(dockerfile)
    target = image_target((tmp_path / "Dockerfile").read_text(), "fixture/Dockerfile")
    builds = source_builds(fixture_lock(tmp_path, *SDIST_ONLY_ENTRIES))
    errors = build_tool_errors(target, builds, real_needs())
    assert len(errors) == 1, errors  # jericho's build-essential is there; deepspeed needs nothing
    assert errors[0].startswith("fixture/Dockerfile: fast-downward-textworld 20.6.4 builds from source")
    assert "and needs cmake, which its apt-get install lacks" in errors[0]


def test_apt_installs_reads_options_pins_and_several_runs() -> None:
    dockerfile = textwrap.dedent(
        """\
        FROM ubuntu:24.04
        # apt-get install not-a-package (a comment)
        RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \\
                --no-install-recommends -o Dpkg::Options::=--force-confnew python3 cmake=3.28.3-1 \\
            && rm -rf /var/lib/apt/lists/*
        RUN apt install -y gcc:amd64; echo apt-get install nothing-here
        RUN ["apt-get", "install", "-y", "make"]
        """
    )
    assert apt_installs(dockerfile) == {"python3", "cmake", "gcc", "make"}


def test_project_extras_of_the_real_dockerfiles() -> None:
    assert project_extras(GPU_DOCKERFILE.read_text()) == {"gpu"}
    assert project_extras(CPU_DOCKERFILE.read_text()) == frozenset()
    assert project_extras("FROM python:3.11-slim-bookworm\nRUN pip install torch==2.13.0\n") is None


def test_image_targets_follow_each_base_image() -> None:
    gpu, cpu = target_of(GPU_DOCKERFILE), target_of(CPU_DOCKERFILE)
    # Ubuntu 24.04: glibc 2.39, python3 3.12; python:3.11-...-bookworm: glibc 2.36.
    assert (gpu.python, gpu.platform, gpu.extras) == ("3.12", "x86_64-manylinux_2_39", {"gpu"})
    assert (cpu.python, cpu.platform, cpu.extras) == ("3.11", "x86_64-manylinux_2_36", frozenset())
    assert {"build-essential", "cmake"} <= gpu.apt and {"build-essential", "cmake"} <= cpu.apt


def test_an_unknown_base_distribution_fails() -> None:
    with pytest.raises(CheckError, match="unknown distribution"):
        image_target("FROM alpine:3.20\nRUN pip install .\n", "fixture/Dockerfile")


def test_the_real_map_has_a_reason_and_debian_names_for_each_entry() -> None:
    needs = real_needs()
    assert set(needs) == set(SDIST_ONLY)
    assert needs["deepspeed"].apt == ()  # a pure-Python setup maps to an empty list
    assert set(needs["fast-downward-textworld"].apt) == {"build-essential", "cmake"}
    assert all(n.reason for n in needs.values())


def test_a_map_entry_without_a_reason_is_refused() -> None:
    with pytest.raises(CheckError, match=r"\[jericho\] must hold exactly"):
        load_build_tools('[jericho]\napt = ["build-essential"]\n')
    with pytest.raises(CheckError, match="one-line reason"):
        load_build_tools('[jericho]\napt = ["build-essential"]\nreason = ""\n')


# --- requires-python and uv --------------------------------------------------------------------


def test_admitted_minors_come_from_pyproject() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert admitted_minors(requires) == ["3.11", "3.12"]
    assert admitted_minors(">=3.10.4,<3.12") == ["3.10", "3.11"]
    with pytest.raises(CheckError, match="no upper bound"):
        admitted_minors(">=3.11")


def test_one_line_keeps_uvs_reason() -> None:
    stderr = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because vllm==0.32.0 depends on numpy>=1.25,<2.4.\n"
        "         And because selective-rollout depends on numpy==2.4.6, we can conclude that your"
        " requirements are unsatisfiable.\n"
    )
    line = one_line(stderr)
    assert "\n" not in line
    assert line.startswith("No solution found when resolving dependencies: Because vllm==0.32.0")
    assert line.endswith("your requirements are unsatisfiable.")


def test_find_uv_fails_with_a_clear_line_when_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CheckError, match=r"uv not found next to .* or on PATH"):
        find_uv()
    fake = write_fake_uv(tmp_path / "bin" / "uv", "")
    assert find_uv() == str(fake)


# --- the CLI against a stand-in uv -------------------------------------------------------------

FAKE_UV = """\
#!{python}
import sys
from pathlib import Path

LOCKS = {locks}
args = sys.argv[1:]
assert args[:2] == ["pip", "compile"], args
if {fail!r}:
    sys.stderr.write({fail!r})
    sys.exit(1)
python = args[args.index("--python-version") + 1]
platform = args[args.index("--python-platform") + 1]
Path(args[args.index("-o") + 1]).write_text(LOCKS[(python, platform)])
"""


def write_fake_uv(path: Path, locks: str, fail: str = "") -> Path:
    """A uv that writes the given fixture lock per (python, platform), or fails with uv's text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_UV.format(python=sys.executable, fail=fail, locks=locks))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def gpu_lock(python: str) -> str:
    tag = f"cp{python.replace('.', '')}-cp{python.replace('.', '')}-manylinux_2_28_x86_64"
    return pylock(entry("torch", "2.13.0", tag), entry("vllm", "0.32.0", tag), *SDIST_ONLY_ENTRIES)


def cli_locks(extra_image_sdist: str = "") -> str:
    cpu = pylock(entry("torch", "2.13.0", "cp311-cp311-manylinux_2_28_x86_64"), *SDIST_ONLY_ENTRIES)
    image_gpu = gpu_lock("3.12") + ("\n" + extra_image_sdist if extra_image_sdist else "")
    return repr(
        {
            ("3.11", "x86_64-manylinux_2_28"): gpu_lock("3.11"),
            ("3.12", "x86_64-manylinux_2_28"): gpu_lock("3.12"),
            ("3.12", "x86_64-manylinux_2_39"): image_gpu,
            ("3.11", "x86_64-manylinux_2_36"): cpu,
        }
    )


def test_cli_passes_and_prints_the_key_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uv = write_fake_uv(tmp_path / "uv", cli_locks())
    assert main(["--uv", str(uv), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    for python in ("3.11", "3.12"):
        assert f"Python {python} (x86_64-manylinux_2_28, base + gpu): torch 2.13.0, vllm 0.32.0" in out
        assert (tmp_path / "out" / f"pylock.py{python.replace('.', '')}.toml").is_file()
    assert "docker/Dockerfile (Python 3.12, x86_64-manylinux_2_39, base + gpu)" in out
    assert "docker/Dockerfile.cpu (Python 3.11, x86_64-manylinux_2_36, base)" in out
    assert out.rstrip().splitlines()[-1].startswith("check_gpu_stack: OK")


def test_cli_fails_with_uvs_reason_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reason = "error: No solution found when resolving dependencies\n  cause: Because numpy==2.4.6 ...\n"
    uv = write_fake_uv(tmp_path / "uv", cli_locks(), fail=reason)
    assert main(["--uv", str(uv), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert (
        "check_gpu_stack: FAIL: Python 3.11 (x86_64-manylinux_2_28, base + gpu) does not resolve: "
        "No solution found when resolving dependencies: Because numpy==2.4.6 ..."
    ) in err
    assert err[-1].startswith("check_gpu_stack: 4 problem(s)")


def test_cli_fails_on_an_image_source_build_the_map_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uv = write_fake_uv(tmp_path / "uv", cli_locks(extra_image_sdist=entry("mystery-ext", "0.1")))
    assert main(["--uv", str(uv), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "FAIL: docker/Dockerfile: mystery-ext 0.1 has no wheel for x86_64-manylinux_2_39" in err
    assert "Dockerfile.cpu" not in err
