"""Where each kind of actor runs on a Ray cluster (docs/cluster.md): resources per actor kind.

Engines and learners go on GPUs, env workers on CPU nodes. Custom resources (e.g. an
``env_node`` resource offered only by CPU nodes) pin a kind of actor to a kind of node.
"""

from typing import Any, Literal

from pydantic import Field

from selective_rollout.config.base import Section

COORDINATOR_NUM_CPUS = 0.5  # light: it mostly waits on engines and env workers


class PlacementConfig(Section):
    """Ray resources of each actor kind; empty dicts mean "anywhere"."""

    learner_num_gpus: float = Field(0.0, ge=0.0, description="GPUs per learner actor (1 on a GPU cluster)")
    learner_num_cpus: float = Field(1.0, gt=0.0, description="CPUs per learner actor")
    learner_resources: dict[str, float] = Field(
        default_factory=dict, description="custom resources per learner"
    )
    engine_resources: dict[str, float] = Field(
        default_factory=dict, description="custom resources per engine"
    )
    env_worker_num_cpus: float = Field(1.0, gt=0.0, description="CPUs per env worker actor")
    env_worker_resources: dict[str, float] = Field(
        default_factory=dict, description="custom resources per env worker, e.g. {env_node: 0.01}"
    )
    env_worker_spread: bool = Field(
        False, description="spread env workers over every node that can host them (Ray SPREAD), not pack"
    )
    coordinator_resources: dict[str, float] = Field(default_factory=dict, description="custom resources")
    allocator: Literal["system", "jemalloc"] = Field(
        "system",
        description="malloc of the engine, learner and coordinator processes: jemalloc (the copy in "
        "Ray's wheel, preloaded) hands back what tensors of every length free, which glibc keeps: "
        "x0.46 the CPU engine's peak memory at x1.15 its wall-clock (bench/engine_memory.py)",
    )

    def process_options(self) -> dict[str, Any]:
        """Ray options that start an actor's process on the configured allocator: ``LD_PRELOAD``
        must be set when the process starts, so it goes in the actor's runtime environment."""
        if self.allocator == "system":
            return {}
        from selective_rollout.process_memory import jemalloc_library

        library = jemalloc_library()
        if library is None:
            raise ValueError(
                "placement.allocator=jemalloc, but this Ray's wheel ships no ray/core/libjemalloc.so; "
                "use placement.allocator=system"
            )
        return {"runtime_env": {"env_vars": {"LD_PRELOAD": str(library)}}}

    def learner_options(self) -> dict[str, object]:
        return {
            "num_gpus": self.learner_num_gpus,
            "num_cpus": self.learner_num_cpus,
            "resources": dict(self.learner_resources),
            **self.process_options(),
        }

    def engine_options(self) -> dict[str, object]:
        resources = {"resources": dict(self.engine_resources)} if self.engine_resources else {}
        return {**resources, **self.process_options()}

    def env_worker_options(self) -> dict[str, object]:
        options: dict[str, object] = {
            "num_cpus": self.env_worker_num_cpus,
            "resources": dict(self.env_worker_resources),
        }
        if self.env_worker_spread:
            options["scheduling_strategy"] = "SPREAD"
        return options

    def coordinator_options(self) -> dict[str, object]:
        resources = {"resources": dict(self.coordinator_resources)} if self.coordinator_resources else {}
        return {**resources, **self.process_options()}
