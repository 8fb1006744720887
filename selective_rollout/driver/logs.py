"""A resumed run's logs made to agree with the checkpoint it resumes from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def rewind_logs(run_dir: Path, ckpt_dir: Path, resume: str) -> None:
    """Make the run's logs agree with the checkpoint it resumes from (or with a fresh start).

    Metrics are logged before the checkpoint is saved and groups as they finish, so a run
    killed in between has lines of iterations it will redo; they are moved to ``*.rewound``
    (never deleted), and the resumed run writes them afresh, once.
    """
    from selective_rollout.learner import latest_checkpoint
    from selective_rollout.learner.checkpoint import read_extra_state
    from selective_rollout.records import rewind_jsonl

    done, evaluated = 0, set()
    if resume != "never" and (latest := latest_checkpoint(ckpt_dir)) is not None:
        state = read_extra_state(latest)
        done, evaluated = int(state["iteration"]), set(state["eval"])

    def logged_before_the_checkpoint(line: dict[str, Any]) -> bool:
        iteration = int(line.get("iteration", 0))
        if iteration < 0:  # the "before" evaluation
            return "before" in evaluated
        # the "after" evaluation is logged at iteration == driver.iterations, the last one done
        return iteration < done or (iteration == done and "after" in evaluated)

    for name in ("rollouts.jsonl", "metrics.jsonl"):
        if moved := rewind_jsonl(run_dir / name, logged_before_the_checkpoint):
            log.warning("%s: %d line(s) after the checkpoint moved to %s.rewound", name, moved, name)
