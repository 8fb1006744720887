"""Where each kind of actor runs on a Ray cluster (docs/cluster.md): resources per actor kind.

Engines and learners go on GPUs, env workers on CPU nodes. Custom resources (e.g. an
``env_node`` resource offered only by CPU nodes) pin a kind of actor to a kind of node.
"""

from typing import Any, Literal

from pydantic import Field

from selective_rollout.config.base import Section

COORDINATOR_NUM_CPUS = 0.5  # light: it mostly waits on engines and env workers
# system: the C library's malloc (glibc on Linux); jemalloc: the copy in Ray's wheel, preloaded, refused
# where Ray ships none; auto: that jemalloc on a Ray the driver started itself on this machine, where
# Ray ships one (its Linux wheels), else the system's (a joined cluster's nodes may keep Ray elsewhere)
Allocator = Literal["system", "jemalloc", "auto"]


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
    engine_allocator: Allocator = Field(
        "system",
        description="malloc of the engine processes: jemalloc (the copy in Ray's wheel, preloaded) hands "
        "back what tensors of every length free, which glibc keeps: x0.46 a CPU engine's peak memory "
        "at x1.15 its wall-clock (bench/engine_memory.py)",
    )
    learner_allocator: Allocator = Field(
        "auto",
        description="malloc of the learner processes; auto: jemalloc on a Ray the driver starts on its "
        "machine, where Ray's wheel ships it (Linux), else the system's (a joined cluster's nodes may "
        "keep Ray at other paths). On jemalloc a CPU learner held x0.51-0.65 the resident memory of "
        "glibc's at a speed within the run-to-run noise (bench/learner_step.py --only allocator, "
        "docs/engines.md)",
    )
    coordinator_allocator: Allocator = Field(
        "system", description="malloc of the coordinator, and so of the env workers it starts"
    )
    pending_timeout_s: float = Field(
        600.0,
        gt=0.0,
        description="stop the run, naming the actors and the resources they lack, when Ray has not "
        "placed every engine, learner, the coordinator and its env workers on a node this many "
        "seconds after they were asked for (an autoscaler adding nodes must be quicker; a placed "
        "actor's model load and compile do not count)",
    )

    def process_options(self, allocator: Allocator, local: bool) -> dict[str, Any]:
        """Ray options that start an actor's process on ``allocator``: ``LD_PRELOAD`` must be set
        when the process starts, so it goes in the actor's runtime environment. ``local``: the
        driver started this Ray on its own machine, so every actor sees the driver's Ray files."""
        if allocator == "system" or (allocator == "auto" and not local):
            return {}
        from selective_rollout.process_memory import jemalloc_library

        library = jemalloc_library()
        if library is None and allocator == "auto":
            return {}
        if library is None:
            raise ValueError(
                "jemalloc was asked for (placement.*_allocator), but this Ray's wheel ships no "
                "ray/core/libjemalloc.so; use system or auto for placement.engine_allocator, "
                "learner_allocator and coordinator_allocator"
            )
        return {"runtime_env": {"env_vars": {"LD_PRELOAD": str(library)}}}

    def learner_options(self, local: bool = False) -> dict[str, object]:
        return {
            "num_gpus": self.learner_num_gpus,
            "num_cpus": self.learner_num_cpus,
            "resources": dict(self.learner_resources),
            **self.process_options(self.learner_allocator, local),
        }

    def engine_options(self, local: bool = False) -> dict[str, object]:
        resources = {"resources": dict(self.engine_resources)} if self.engine_resources else {}
        return {**resources, **self.process_options(self.engine_allocator, local)}

    def env_worker_options(self) -> dict[str, object]:
        options: dict[str, object] = {
            "num_cpus": self.env_worker_num_cpus,
            "resources": dict(self.env_worker_resources),
        }
        if self.env_worker_spread:
            options["scheduling_strategy"] = "SPREAD"
        return options

    def coordinator_options(self, local: bool = False) -> dict[str, object]:
        resources = {"resources": dict(self.coordinator_resources)} if self.coordinator_resources else {}
        return {**resources, **self.process_options(self.coordinator_allocator, local)}
