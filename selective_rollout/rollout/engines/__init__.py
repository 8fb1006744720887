"""Rollout engines behind one async interface, started as Ray actors.

A back-end is one module (its ``RolloutEngine`` subclass) plus one line in
``selective_rollout/plugins.py`` (read by ``BACKENDS``) naming it and its ``Params`` (the
back-end's own ``engine.*`` keys, kept in a light module: ``engines/params.py`` for the shipped
ones), or an entry point of the group "selective_rollout.engines" in a package of yours. Modules
are imported only when that back-end is used, and none imports its generation library at module
level, so the package and config validation work on machines without vLLM.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selective_rollout.rollout.engines.base import (
    BACKENDS,
    Completion,
    CompletionOutput,
    EngineError,
    RolloutEngine,
    SamplingParams,
)

if TYPE_CHECKING:
    from selective_rollout.config.engine import EngineConfig


def engine_class(backend: str) -> type[RolloutEngine]:
    """The ``RolloutEngine`` subclass registered under ``backend`` (its module imported now)."""
    return BACKENDS.get(backend)


def check_backend_installed(backend: str) -> None:
    """One clear error, in seconds, when the back-end's library is missing here (instead of a
    long traceback from every engine actor once Ray has started them)."""
    engine_class(backend)
    library = BACKENDS.meta(backend).get("requires")
    if library is not None and importlib.util.find_spec(library) is None:
        raise ValueError(
            f"engine.backend={backend}, but {library} is not installed in this environment "
            f"({sys.executable}); install it (GPU: pip install '.[gpu]'; CPU: make test-vllm's "
            "venv) or use engine.backend=transformers"
        )


def create_engines(
    cfg: EngineConfig, model_path: Path, num: int, actor_options: dict[str, Any] | None = None
) -> list[Any]:
    """Start ``num`` engine actors (async Ray actors) serving ``model_path``.

    ``actor_options`` go to ``.options()`` (e.g. a placement-group scheduling strategy on a
    cluster) and override the CPU/GPU resources taken from ``cfg``.
    """
    import ray

    if num < 1:
        raise ValueError(f"create_engines: num must be >= 1, got {num}")
    actor_cls = ray.remote(engine_class(cfg.backend))
    options = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, **(actor_options or {})}
    return [actor_cls.options(**options).remote(cfg, str(model_path)) for _ in range(num)]


__all__ = [
    "BACKENDS",
    "Completion",
    "CompletionOutput",
    "EngineError",
    "RolloutEngine",
    "SamplingParams",
    "check_backend_installed",
    "create_engines",
    "engine_class",
]
