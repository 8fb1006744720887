"""What a run tells its user: metric logging back-ends (JSONL, wandb, TensorBoard) and the run report.

``metrics_log`` sits in the base layer (the coordinator and the driver write through it);
``report`` reads a finished run's logs and writes its report (beside the learner side).
"""
