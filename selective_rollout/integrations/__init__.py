"""The gate where users already are: other trainers and multi-sample inference loops.

Nothing here imports a third-party trainer at package import time; ``integrations.openrlhf``
imports ``openrlhf`` only when it is itself imported.
"""
