"""The driver: the loop over a run's iterations (``loop``) and the set of actors it drives
(``actors``), with their helpers: the logs a resume rewinds (``logs``), the engines' counters
(``engine_stats``) and the proof that an update is served (``update_check``)."""

from selective_rollout.driver.actors import RunActors, unshared_run_dir_error
from selective_rollout.driver.engine_stats import cache_metrics
from selective_rollout.driver.logs import rewind_logs
from selective_rollout.driver.loop import Driver

__all__ = ["Driver", "RunActors", "cache_metrics", "rewind_logs", "unshared_run_dir_error"]
