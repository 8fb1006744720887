"""Config of the agent: prompt format and action parsing (selective_rollout.rollout.agent)."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class AgentConfig(Section):
    action_format: Literal["react", "action"] = "action"
    constrain_to_admissible: bool = True
    history_turns: int = Field(8, ge=0)
