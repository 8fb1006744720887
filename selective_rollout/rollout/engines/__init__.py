"""Rollout engines behind one async interface, and the registry that starts them as Ray actors.

A back-end is one module (its ``RolloutEngine`` subclass and that class's ``Params``, the
back-end's own ``engine.*`` keys) plus one ``register_backend`` entry here. Modules are imported
only when that back-end is used or its parameters are read, and none imports its generation
library at module level, so the package and config validation work on machines without vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selective_rollout.config.engine import EngineConfig
from selective_rollout.rollout.engines.base import (
    BackendParams,
    Completion,
    CompletionOutput,
    EngineError,
    RolloutEngine,
    SamplingParams,
)


@dataclass(frozen=True)
class Backend:
    """A registered back-end: ``target`` is its class as ``"module:Class"`` (imported on first
    use), ``requires`` the library it needs at run time (imported inside the engine, checked
    before Ray starts by ``check_backend_installed``)."""

    target: str
    requires: str | None = None


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, target: str, requires: str | None = None) -> None:
    """Make ``engine.backend=name`` start the ``RolloutEngine`` at ``target`` (``"module:Class"``)."""
    if name in BACKENDS:
        raise ValueError(f"engine back-end {name!r} is registered twice")
    if target.count(":") != 1:
        raise ValueError(f"engine back-end {name!r}: target must be 'module:Class', got {target!r}")
    BACKENDS[name] = Backend(target, requires)


register_backend(
    "transformers", "selective_rollout.rollout.engines.transformers_engine:TransformersEngine", "transformers"
)
register_backend("vllm", "selective_rollout.rollout.engines.vllm_engine:VLLMEngine", "vllm")


def check_backend_installed(backend: str) -> None:
    """One clear error, in seconds, when the back-end's library is missing here (instead of a
    long traceback from every engine actor once Ray has started them)."""
    engine_class(backend)
    library = BACKENDS[backend].requires
    if library is not None and importlib.util.find_spec(library) is None:
        raise ValueError(
            f"engine.backend={backend}, but {library} is not installed in this environment "
            f"({sys.executable}); install it (GPU: pip install '.[gpu]'; CPU: make test-vllm's "
            "venv) or use engine.backend=transformers"
        )


def engine_class(backend: str) -> type[RolloutEngine]:
    """The ``RolloutEngine`` subclass registered under ``backend`` (its module imported now)."""
    entry = BACKENDS.get(backend)
    if entry is None:
        raise ValueError(f"unknown engine backend {backend!r}; known: {sorted(BACKENDS)}")
    module, name = entry.target.split(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, RolloutEngine)):
        raise TypeError(f"engine back-end {backend!r}: {entry.target} is not a RolloutEngine subclass")
    if not issubclass(cls.Params, BackendParams):
        raise TypeError(f"engine back-end {backend!r}: Params must subclass BackendParams")
    return cls


class _EngineClasses(Mapping[str, type[RolloutEngine]]):
    """The registered back-ends' classes by name, each module imported when its class is first
    looked up: config validation looks up the selected back-end, and the others only to name the
    owner of a misplaced key, so a back-end whose library is absent here still validates."""

    def __getitem__(self, backend: str) -> type[RolloutEngine]:
        if backend not in BACKENDS:
            raise KeyError(backend)
        return engine_class(backend)

    def __iter__(self) -> Iterator[str]:
        return iter(BACKENDS)

    def __len__(self) -> int:
        return len(BACKENDS)


ENGINE_CLASSES = _EngineClasses()


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
    "ENGINE_CLASSES",
    "Backend",
    "BackendParams",
    "Completion",
    "CompletionOutput",
    "EngineError",
    "RolloutEngine",
    "SamplingParams",
    "check_backend_installed",
    "create_engines",
    "engine_class",
    "register_backend",
]
