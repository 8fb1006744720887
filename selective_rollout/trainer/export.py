"""Deprecated command line ``python -m selective_rollout.trainer.export``, kept for one release:
``python -m selective_rollout.learner.export`` is the same command."""

from __future__ import annotations

import sys

from selective_rollout.learner.export import *  # noqa: F403  (the old module's names)
from selective_rollout.learner.export import main

if __name__ == "__main__":
    print(
        "python -m selective_rollout.trainer.export is deprecated: "
        "use python -m selective_rollout.learner.export",
        file=sys.stderr,
    )
    raise SystemExit(main())
