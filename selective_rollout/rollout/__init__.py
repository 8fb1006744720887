"""The rollout layer: engines, the agent's prompts and actions, rollout strategies, the group
lifecycle and the two rollout sources (the concurrent coordinator and the lock-step loop)."""
