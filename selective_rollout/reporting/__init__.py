"""What a run tells its user: metric logging back-ends (JSONL, wandb, TensorBoard) and the run report.

``metrics_log`` sits low (floor 1: the coordinator and the driver write through it); ``report``
reads a finished run's logs and writes its report (floor 3).
"""
