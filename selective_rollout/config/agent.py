"""Config of the agent: prompt format and action parsing (selective_rollout.rollout.agent)."""

from typing import Literal

from pydantic import Field, model_validator

from selective_rollout.config.base import Section


class AgentConfig(Section):
    action_format: Literal["react", "action"] = "action"
    constrain_to_admissible: bool = Field(
        True, description="decode only admissible commands (each closed by end-of-turn); action format only"
    )
    admissible_in_prompt: Literal["every_turn", "first_turn"] = Field(
        "every_turn",
        description="list the admissible commands in every user turn, or only in a segment's first "
        "(with constrained decoding the list is enforced anyway; each re-listing costs ~100 prompt tokens)",
    )
    history_turns: int = Field(8, ge=0, description="past exchanges kept in a prompt before a new segment")
    fuzzy_threshold: float = Field(
        0.85, ge=0.0, le=1.0, description="min normalised similarity of a fuzzy match"
    )

    @model_validator(mode="after")
    def _constrained_needs_action_format(self) -> "AgentConfig":
        if self.constrain_to_admissible and self.action_format == "react":
            raise ValueError(
                "constrain_to_admissible restricts the whole reply to one command, which leaves no room "
                "for a ReAct thought: use action_format=action or constrain_to_admissible=false"
            )
        return self

    @model_validator(mode="after")
    def _unlisted_needs_constraint(self) -> "AgentConfig":
        if self.admissible_in_prompt != "every_turn" and not self.constrain_to_admissible:
            raise ValueError(
                "admissible_in_prompt=first_turn leaves the policy without the list of valid commands: "
                "it needs constrain_to_admissible=true"
            )
        return self
