"""selective-rollout: gated multi-turn GRPO rollouts for LLM agents.

The package is layered and imports only point down (docs/design.md, checked by
tests/test_layers.py): the base layer (records, gate, config, envs, weight sync, metric logging)
< rollout < the learner side, evaluation and the report < the driver (train) < the experiment
runner.
"""

__version__ = "0.1.0"
