"""Start ``python -m selective_rollout.serve`` on loopback as a subprocess; stop it by its PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def chat_server(model_path: Path, name: str = "smollm2", timeout_s: float = 180.0) -> Iterator[str]:
    """Yields the base URL (``http://127.0.0.1:PORT/v1``) once the server accepts requests."""
    cmd = [sys.executable, "-m", "selective_rollout.serve", "--model", str(model_path)]
    cmd += ["--served-model-name", name, "--port", "0", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        for line in proc.stdout:  # the server prints its address once it listens
            if line.startswith("listening on"):
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, f"server exited before listening (rc={proc.poll()})"
        yield f"http://127.0.0.1:{match.group(1)}/v1"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
