"""selective-rollout: gated multi-turn GRPO rollouts for LLM agents.

The package is layered (DESIGN.md 2.1.1); imports only point down:
records/gate/config (floor 1) < rollout (2) < trainer, evaluate, report (3) < train (4)
< experiment (5).
"""

__version__ = "0.1.0"
