"""The offline analysis: what reads a run's (or many runs') logs after the fact.

``gate_eval`` replays logged rollouts through gates (the sweep, the held-out evaluation, the learned
gate's fitting), ``trajectory_stop_eval`` does the same for trajectory stop rules, ``experiment``
runs arms x seeds and compares them, ``report`` writes a finished run's report, ``power`` says how
precisely a held-out change was measured, ``offpolicy`` how stale an async run's batches were, and
``policy_eval`` evaluates a policy on held-out tasks and compares two evaluations task by task.
It imports the run-time side and is never imported by it (tests/test_layers.py).
"""
