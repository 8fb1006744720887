"""``make gpu-smoke``'s exit status and last line: 0 only when every step passed (``--allow-skip``:
when none failed), the count ``N passed, N failed, N skipped`` always last, and without CUDA every
step a SKIP with that reason, not a silent 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_smoke

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("statuses", "allow_skip", "status"),
    [
        (["PASS", "PASS"], False, 0),
        (["PASS", "SKIP"], False, 1),
        (["PASS", "SKIP"], True, 0),
        (["PASS", "FAIL", "SKIP"], True, 1),
        ([], True, 1),
    ],
    ids=["all-passed", "a-skip", "a-skip-allowed", "a-failure", "no-step"],
)
def test_the_exit_status_needs_every_step_passed(monkeypatch, capsys, statuses, allow_skip, status) -> None:
    results = [(f"step {i}", s, f"why {i}") for i, s in enumerate(statuses)]
    monkeypatch.setattr(gpu_smoke, "RESULTS", results)
    assert gpu_smoke.summary(allow_skip) == status
    out = capsys.readouterr().out.splitlines()
    count = [statuses.count(s) for s in ("PASS", "FAIL", "SKIP")]
    assert out[-1] == "{} passed, {} failed, {} skipped".format(*count)
    named = [line for line in out if line.startswith("exit status 1")]
    if "SKIP" in statuses and not allow_skip:  # the skips are named once more, with their reasons
        assert named == ["exit status 1, not proved (--allow-skip accepts skips): step 1 (why 1)"]
    else:
        assert named == []


@pytest.mark.parametrize("allow_skip", [False, True], ids=["skips-fail", "allow-skip"])
def test_without_cuda_every_step_is_a_skip_with_the_reason(allow_skip: bool) -> None:
    done = subprocess.run(
        [sys.executable, "bench/gpu_smoke.py", *(["--allow-skip"] if allow_skip else [])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    lines = done.stdout.splitlines()
    skips = [line for line in lines if line.startswith("SKIP")]
    names = [line.split(None, 1)[1].split(": ")[0] for line in skips]
    assert names == [check.step_name for check in gpu_smoke.CHECKS]
    assert all(line.endswith(": no CUDA device visible to torch") for line in skips), done.stdout
    assert lines[-1] == f"0 passed, 0 failed, {len(gpu_smoke.CHECKS)} skipped", done.stdout
    assert done.returncode == (0 if allow_skip else 1), done.stdout + done.stderr
