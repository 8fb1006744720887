"""The loss components' parameters, in a module that imports nothing but pydantic.

A loss component is a frozen pydantic model whose fields are its parameters (flat ``trainer.*``
keys). Where its module imports torch, its fields are declared here and the component subclasses
them, so that config validation reads ``trainer.clip_high`` without importing torch
(the entry's line in ``selective_rollout/plugins.py`` names the model as its ``params``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Entry(BaseModel):
    """Base of every loss component: its fields are its parameters, fixed once bound."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Entry):
    """The parameters of a component that owns no key."""


class PPOClipParams(Entry):
    clip_low: float = Field(
        0.2, ge=0.0, lt=1.0, description="ppo_clip: the ratio is clipped below at 1 - clip_low"
    )
    clip_high: float = Field(
        0.28, ge=0.0, description="ppo_clip: the ratio is clipped above at 1 + clip_high (DAPO clip-higher)"
    )


class DecoupledPPOParams(PPOClipParams):
    is_cap: float = Field(
        2.0,
        ge=1.0,
        description="decoupled_ppo: the behaviour importance weight pi_proximal / pi_behaviour of a "
        "stale token is truncated at this value",
    )
