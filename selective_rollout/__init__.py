"""selective-rollout: gated multi-turn GRPO rollouts for LLM agents.

The package is layered and imports only point down (docs/design.md, checked by
tests/test_layers.py): the base layer (records, gate, config, envs, weight sync, metric logging)
< rollout < the learner side < the driver < the offline analysis (``analysis``: evaluations over
logs, experiments, the run report) < the training command line. Modules that moved keep their old
names for one release (``_moved``).
"""

from selective_rollout import _moved

__version__ = "0.1.0"

_moved.install()
