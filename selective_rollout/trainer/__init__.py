"""The learner side (DESIGN.md 2.1, floor 3): advantages, GRPO loss, packing, DeepSpeed learners, sync."""

from selective_rollout.trainer.checkpoint import latest_checkpoint
from selective_rollout.trainer.group import LearnerGroup

__all__ = ["LearnerGroup", "latest_checkpoint"]
