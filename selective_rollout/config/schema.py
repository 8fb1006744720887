"""The root of the run config: one section per component, each owned by its own module."""

from pydantic import Field

from selective_rollout.config.agent import AgentConfig
from selective_rollout.config.base import Section
from selective_rollout.config.engine import EngineConfig
from selective_rollout.config.env import EnvConfig
from selective_rollout.config.gate import GateConfig
from selective_rollout.config.rollout import RolloutConfig
from selective_rollout.config.trainer import TrainerConfig


class RunConfig(Section):
    name: str = Field("run", min_length=1)
    seed: int = 0
    gate: GateConfig = GateConfig()
    env: EnvConfig = EnvConfig()
    engine: EngineConfig = EngineConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
