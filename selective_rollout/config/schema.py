"""The root of the run config: one section per component, each owned by its own module."""

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from pydantic import Field, model_validator

from selective_rollout.config.agent import AgentConfig
from selective_rollout.config.base import Section
from selective_rollout.config.driver import DriverConfig, EvalConfig, WarmStartConfig
from selective_rollout.config.engine import EngineConfig
from selective_rollout.config.env import EnvConfig
from selective_rollout.config.gate import GateConfig
from selective_rollout.config.logging import LoggingConfig
from selective_rollout.config.placement import PlacementConfig
from selective_rollout.config.rollout import RolloutConfig
from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.config.trajectory_stop import TrajectoryStopConfig

log = logging.getLogger(__name__)

# sections with a deprecated spelling: the old one is still read, with a warning
RENAMED_SECTIONS = {"train": "driver"}


def move_renamed_sections(tree: MutableMapping[str, Any]) -> None:
    """Move a section given under its old name to its new one, with one warning line; where one
    tree has both, the new name's keys win. ``load_config`` calls it on each layer (the file, the
    overrides) before it merges them, so a later layer still overrides an earlier one whichever
    name each uses; ``RunConfig`` calls it on what it validates (an old run's saved config)."""
    for old, new in RENAMED_SECTIONS.items():
        if old not in tree:
            continue
        log.warning("config: the %r section is deprecated; it is read as %r", old, new)
        moved, given = tree.pop(old), tree.get(new)
        if isinstance(moved, Mapping) and isinstance(given, Mapping):
            tree[new] = {**moved, **given}
        elif given is None:
            tree[new] = moved


class RunConfig(Section):
    """A whole run: one section per component."""

    name: str = Field("run", min_length=1, description="run name; the run folder is runs/<name>-<time>")
    seed: int = Field(0, description="seeds sampling, task order and the learner")
    gate: GateConfig = GateConfig()
    # built on use, not at import: validating it reads the trajectory stop registry
    trajectory_stop: TrajectoryStopConfig = Field(default_factory=TrajectoryStopConfig)
    env: EnvConfig = EnvConfig()
    # built on use, not at import: validating it reads the engine back-end registry
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = AgentConfig()
    # built on use, not at import: validating it reads the rollout strategy registry
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    # built on use, not at import: validating it reads the trainer's loss registries
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    driver: DriverConfig = DriverConfig()
    eval: EvalConfig = EvalConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    logging: LoggingConfig = LoggingConfig()
    placement: PlacementConfig = PlacementConfig()

    @property
    def regime_k(self) -> int:
        """The step at which a report measures the regime's D_K spread (``logging.regime_k``), at most
        the episode cap: a profile's regime key should not stop a run with shorter episodes (a test
        or a quick try), whose D_K is then read at its last step."""
        return min(self.logging.regime_k or self.gate.k, self.rollout.max_steps)

    @model_validator(mode="before")
    @classmethod
    def _renamed_sections(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = dict(data)  # the caller's tree stays as given
            move_renamed_sections(data)
        return data

    @model_validator(mode="after")
    def _gate_within_episode(self) -> "RunConfig":
        if self.rollout.uses_gate and self.gate.k > self.rollout.max_steps:
            raise ValueError(
                f"gate.k={self.gate.k} exceeds rollout.max_steps={self.rollout.max_steps}: "
                "the gate would never look"
            )
        return self

    @model_validator(mode="after")
    def _trajectory_stop_within_episode(self) -> "RunConfig":
        """A trajectory ends at the cap before it is asked there, so a rule whose first step is
        the cap would never stop one."""
        stop = self.trajectory_stop
        if stop.name != "none" and stop.min_step >= self.rollout.max_steps:
            raise ValueError(
                f"trajectory_stop.min_step={stop.min_step} is not below rollout.max_steps="
                f"{self.rollout.max_steps}: the rule would never stop a trajectory"
            )
        return self

    @model_validator(mode="after")
    def _rescore_only_what_trains(self) -> "RunConfig":
        """A back-end that can re-score constrained replies for the model's unconstrained
        log-probs (``engine.rescore_choices``) pays a whole uncached prefill per reply for it; left
        unset, it does so exactly when the learner trains on the engine's log-probs: as the old
        policy (``trainer.old_logprobs: engine``), or as the behaviour policy of stale tokens
        (``driver.pipeline: async`` or ``stream`` with ``decoupled_ppo``). The dumped config says what ran."""
        if "rescore_choices" in (self.engine.model_extra or {}) and self.engine.rescore_choices is None:
            behaviour = self.driver.pipelined and self.trainer.policy_loss == "decoupled_ppo"
            self.engine.rescore_choices = self.trainer.old_logprobs == "engine" or behaviour
        return self

    @model_validator(mode="after")
    def _nccl_needs_a_gpu_each(self) -> "RunConfig":
        """NCCL refuses two ranks of one group on one GPU ("Duplicate GPU detected"), and fractional
        GPUs let Ray put a learner and an engine on the same one. ``auto`` is NCCL wherever the
        learners run on CUDA (``LearnerGroup.sync_method``), and a run that asks for GPUs does, so
        it is refused the same way: the run would otherwise fail at its first weight sync."""
        learner, engine = self.placement.learner_num_gpus, self.engine.num_gpus
        sync = self.trainer.weight_sync
        nccl = sync == "nccl" or (sync == "auto" and (learner > 0 or engine > 0))
        if nccl and (0 < learner < 1 or 0 < engine < 1):
            means = " (auto means NCCL on GPUs)" if sync == "auto" else ""
            raise ValueError(
                f"trainer.weight_sync={sync}{means} with placement.learner_num_gpus={learner:g} and "
                f"engine.num_gpus={engine:g}: a fractional GPU lets Ray place a learner and an engine "
                "on one GPU, which NCCL refuses; give each at least 1 GPU, or set "
                "trainer.weight_sync=gloo"
            )
        return self
