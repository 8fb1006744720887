"""Refuse a CPU build of torch in the GPU venv (``make install-gpu``), with one line naming it.

pip takes ``torch 2.13.0+cpu`` for ``torch==2.13.0`` (PEP 440 ignores the local label), so a venv
that already holds the CPU build, or an index that serves it first, gives vLLM's CUDA wheels a
torch that cannot run them; the failure would otherwise show at the first kernel of a smoke run.
``torch.version.cuda`` is None on a CPU build.

    .venv-gpu/bin/python launch/check_torch_build.py
"""

from __future__ import annotations

import sys
from pathlib import Path


def cpu_build_error(version: str, cuda: str | None, venv: str) -> str | None:
    """The one line that refuses a torch without CUDA in ``venv``; None for a CUDA build."""
    if cuda is not None:
        return None
    return (
        f"install-gpu: {venv} has torch {version}, a CPU build; "
        f"remove {venv} and run make install-gpu on a node with CUDA"
    )


def venv_name() -> str:
    """The venv this interpreter runs in, as the user's make command names it (relative to here)."""
    prefix, here = Path(sys.prefix), Path.cwd()
    return str(prefix.relative_to(here)) if prefix.is_relative_to(here) else str(prefix)


def main() -> int:
    import torch

    error = cpu_build_error(torch.__version__, torch.version.cuda, venv_name())
    if error:
        print(error, file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
