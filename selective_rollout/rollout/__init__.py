"""Floor 2: engines, the agent's prompts and actions, rollout strategies and the coordinator."""
