"""A/B experiments over whole training runs (``python -m selective_rollout.analysis.experiment``,
``cli``): the experiment file (``schema``), running its arms (``runs``), the paired statistics
(``tables``), the written outputs (``markdown``) and the plot (``plots``)."""

from selective_rollout.analysis.experiment.cli import main
from selective_rollout.analysis.experiment.markdown import (
    cost_power_section,
    held_out_section,
    precision_section,
    versus_section,
    write_outputs,
)
from selective_rollout.analysis.experiment.plots import plot
from selective_rollout.analysis.experiment.runs import (
    arm_metrics,
    before_eval_key,
    finished_run,
    paired_cut_precision,
    plan_experiment,
    prepare,
    run_arm,
    run_experiment,
    run_overrides,
)
from selective_rollout.analysis.experiment.schema import (
    METRICS,
    TINY_RUN,
    ExperimentConfig,
    SweepSpec,
    load_experiment,
    tiny_experiment,
)
from selective_rollout.analysis.experiment.tables import (
    held_out_changes,
    paired_differences,
    pooled_held_out,
)

__all__ = [
    "METRICS",
    "TINY_RUN",
    "ExperimentConfig",
    "SweepSpec",
    "arm_metrics",
    "before_eval_key",
    "cost_power_section",
    "finished_run",
    "held_out_changes",
    "held_out_section",
    "load_experiment",
    "main",
    "paired_cut_precision",
    "paired_differences",
    "plan_experiment",
    "plot",
    "pooled_held_out",
    "precision_section",
    "prepare",
    "run_arm",
    "run_experiment",
    "run_overrides",
    "tiny_experiment",
    "versus_section",
    "write_outputs",
]
