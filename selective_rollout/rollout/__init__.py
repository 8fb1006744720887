"""The rollout layer: engines, the agent's prompts and actions, rollout strategies and the coordinator."""
