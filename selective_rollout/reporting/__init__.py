"""What a run writes about itself while it runs: metric logging back-ends (JSONL, wandb,
TensorBoard; ``metrics_log``) and where the hardware waited (``idle``). The report of a finished
run is offline analysis (``selective_rollout.analysis.report``)."""
