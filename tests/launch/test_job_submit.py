"""Round trip through launch/submit.py to a real Ray head started (and ended) by this test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch.ray_nodes import start_head, submit

# Runs inside the job: it must see the forwarded env var, run in the uploaded checkout (without
# the virtualenv), and join the cluster through the RAY_ADDRESS the job sets.
PROBE = (
    "import os, ray, selective_rollout; ray.init(); "
    "print('PROBE', os.environ['SR_PROBE'], os.path.isdir('launch'), os.path.exists('.venv'), "
    "selective_rollout.__file__.startswith(os.getcwd()), ray.get(ray.remote(lambda: 21 * 2).remote()))"
)


@pytest.mark.slow
def test_submit_round_trip_and_clean_teardown(tmp_path: Path) -> None:
    head = start_head(tmp_path)
    try:
        ok = submit(head.dashboard_url, "--env", "SR_PROBE=forwarded", "--command", f'python -c "{PROBE}"')
        assert ok.returncode == 0, head.log_tail() + ok.stderr + ok.stdout
        assert "SUCCEEDED" in ok.stderr
        assert "PROBE forwarded True False True 42" in ok.stdout, ok.stdout

        failed = submit(head.dashboard_url, "--quiet", "--command", "python -c 'raise SystemExit(3)'")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "FAILED" in failed.stderr
        head.remember_descendants()
    finally:
        survivors = head.stop()
    assert head.proc.returncode is not None
    assert survivors == [], f"Ray processes outlived their head: {survivors}"
