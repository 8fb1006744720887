"""The root of the run config: one section per component, each owned by its own module."""

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


class RunConfig(Section):
    """A whole run: one section per component."""

    name: str = Field("run", min_length=1, description="run name; the run folder is runs/<name>-<time>")
    seed: int = Field(0, description="seeds sampling, task order and the learner")
    gate: GateConfig = GateConfig()
    env: EnvConfig = EnvConfig()
    engine: EngineConfig = EngineConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    train: DriverConfig = DriverConfig()
    eval: EvalConfig = EvalConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    logging: LoggingConfig = LoggingConfig()
    placement: PlacementConfig = PlacementConfig()

    @model_validator(mode="after")
    def _gate_within_episode(self) -> "RunConfig":
        if self.rollout.strategy.startswith("selective") and self.gate.k > self.rollout.max_steps:
            raise ValueError(
                f"gate.k={self.gate.k} exceeds rollout.max_steps={self.rollout.max_steps}: "
                "the gate would never look"
            )
        return self
