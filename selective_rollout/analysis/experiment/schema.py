"""The experiment file: which base run, which arms, which seeds (``ExperimentConfig``), the
metrics an experiment compares, and ``--tiny``'s smallest run of every arm."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from selective_rollout.config import ConfigError

METRICS = {
    "wall_s": "wall-clock (s)",
    "s_per_iteration": "wall-clock per iteration (s)",
    "informative_per_hour": "informative groups trained per hour",
    "engine_wait_frac": "engines' share of time waiting",
    "learner_wait_frac": "learners' share of time waiting",
    "learner_step_s": "learner step (s, mean per iteration)",
    "trained_tokens_per_iteration": "trained tokens per iteration",
    "rollout_wall_s": "rollout wall-clock (s)",
    "step_tokens": "rollout step-tokens",
    "groups_cut": "groups cut",
    "groups_stale": "groups dropped as stale (driver.pipeline=stream)",
    "groups_kept": "groups trained on",
    "informative_kept": "informative groups trained on",
    "rollout_s_per_informative": "rollout s per informative group",
    "step_tokens_per_informative": "step-tokens per informative group",
    "audit_precision": "audited gate precision",
    "cuts_matched": "cuts matched in the reference run",
    "paired_cut_precision": "cuts zero-variance in the reference run",
    "false_cuts": "informative groups lost to false cuts (by the reference run)",
    "cuts_all_fail": "cuts of groups all-fail in the reference run",
    "cuts_all_succeed": "cuts of groups all-succeed in the reference run",
    "audited_all_fail": "audited stops that were all-fail",
    "audited_all_succeed": "audited stops that were all-succeed",
    "trajectories_stopped": "trajectories ended early by the trajectory stop rule",
    "trajectory_label_precision": "audited label precision of trajectory stops",
    "zero_var_frac": "zero-variance share",
    "success_before": "held-out success before",
    "success_after": "held-out success after",
    "success_gain": "held-out change (after - before, paired per task)",
    "success_gain_ci_low": "held-out change: 95% CI low (over tasks)",
    "train_success": "training success (sampled rollouts, mean over iterations)",
    "train_success_last": "training success, last iteration",
    "loss_abs_max": "largest |loss| of a learner step",
    "grad_norm_max": "largest gradient norm of a learner step",
    "is_within_cap": "stale tokens whose importance weight is within the cap",
    "ess_min": "smallest effective sample size of a step (share)",
}


# The plot's panels unless an experiment names its own (``plot:``)
PLOT_METRICS = (
    "rollout_s_per_informative",
    "step_tokens_per_informative",
    "informative_kept",
    "groups_cut",
    "zero_var_frac",
    "success_gain",
)


# The smallest run that still plays every part of an iteration (a rollout, a learner step, a
# weight sync, the held-out evaluation before and after): tiny games generated wherever
# env.games_dir points, one group of G = 2, no warm start, one held-out task, one iteration. The
# episodes keep the profile's length: a gate or trajectory stop decides at its own step, which a
# shorter episode would refuse (the gate would never look).
# The runner's --tiny mode and the bench scripts' run it, and CI runs those (tests/bench), so a
# command a record names cannot silently stop working; its figures mean nothing.
TINY_RUN = [
    "env.preset=tiny",
    "env.generate=true",
    "env.n_train=6",
    "env.n_valid=2",
    "env.num_workers=1",
    "rollout.group_size=2",
    "rollout.groups_per_iteration=1",
    "rollout.max_groups_in_flight=1",
    "warm_start.enabled=false",
    "eval.num_tasks=1",
    "eval.tries=1",
    "driver.iterations=1",
    "logging.backends=[jsonl]",
    "logging.progress=false",
]


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: list[int] = Field(default_factory=lambda: [2, 4, 6])
    tau: str = "0.02:0.30:0.04"


class ExperimentConfig(BaseModel):
    """An experiment file: which base run, which arms, which seeds."""

    model_config = ConfigDict(extra="forbid")
    # the shared overrides as layers: an origin's (overrides_of), then this file's own
    _layers: list[list[str]] | None = PrivateAttr(default=None)
    name: str = "experiment"
    base: str | None = Field(
        None, description="base run config (path relative to the experiment file or the CWD)"
    )
    overrides: list[str] = Field(default_factory=list, description="applied to every arm")
    overrides_of: str | None = Field(
        None,
        description="another experiment file (relative to this one) whose base and overrides this "
        "one takes, before its own: variants of one profile share a single list, so their runs "
        "stay identical to the original's and are reused from its folder",
    )
    arms: dict[str, list[str]] = Field(
        min_length=2, description="arm name -> its overrides; first = reference"
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    bootstrap: int = Field(2000, ge=100)
    aimed_change: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="the relative change of the cost per informative group the experiment aims to "
        "detect: the report says how many seeds a CI over seeds excluding 0 would take at it",
    )
    sweep: SweepSpec | None = SweepSpec()
    plot: list[str] = Field(
        default_factory=lambda: list(PLOT_METRICS),
        description="the metrics experiment.png draws, one panel each (the held-out change is always drawn)",
    )
    versus: list[str] = Field(
        default_factory=list,
        description="arms besides the first to compare every other arm's held-out change with (the "
        "gated arms against the arm that only leaves zero-variance groups out of the loss, say)",
    )
    gate_memory: dict[str, list[str]] = Field(
        default_factory=dict,
        description="arm -> arms whose runs on the *other* seeds its gate observes before it starts "
        "(gate.observe_logs): a gate with memory (history) meets tasks it has seen, as in a longer "
        "run, but never the paired run of its own seed; the listed arms must come before it",
    )
    share_before_eval: bool = Field(
        True,
        description="play the held-out 'before' evaluation once per seed: the arms of a seed start "
        "from the same weights on the same tasks, and the greedy evaluation scores the same weights "
        "the same (eval.max_in_flight 1), so later arms reuse the first one's instead of replaying it",
    )
    keep_checkpoints: bool = Field(
        False,
        description="keep each finished arm's checkpoints; a finished arm is read back from its "
        "report.json, so by default its checkpoints (optimizer state included: ~1.6 GB each for the "
        "135M CPU profile) are deleted once the arm is done",
    )

    @field_validator("plot")
    @classmethod
    def _known_metrics(cls, value: list[str]) -> list[str]:
        unknown = [key for key in value if key not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(METRICS)}")
        return value

    def layers(self) -> list[list[str]]:
        """The shared overrides as ``load_config`` layers: an origin's, then this file's."""
        return self._layers if self._layers is not None else [self.overrides]


def load_experiment(path: str | Path) -> tuple[ExperimentConfig, Path]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file not found: {path}")
    try:
        exp = ExperimentConfig.model_validate(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    except ValidationError as exc:
        first = exc.errors()[0]
        hint = (
            " (YAML reads bare on/off/yes/no as booleans: quote such arm names)"
            if "[key]" in first["loc"]
            else ""
        )
        raise ConfigError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}{hint}") from None
    if exp.overrides_of is not None:
        if exp.base is not None:
            raise ConfigError(f"{path}: base: and overrides_of: both name a base run config; keep one")
        origin, origin_base = load_experiment(path.parent / exp.overrides_of)
        own = exp.overrides
        exp = exp.model_copy(update={"base": str(origin_base), "overrides": [*origin.overrides, *own]})
        exp._layers = [*origin.layers(), own]
    if exp.base is None:
        raise ConfigError(f"{path}: base: the experiment names no base run config (base: or overrides_of:)")
    order = list(exp.arms)
    unknown = [arm for arm in exp.versus if arm not in exp.arms]
    if unknown:
        raise ConfigError(f"{path}: versus names arms that are not in arms: {', '.join(unknown)}")
    for arm, sources in exp.gate_memory.items():
        if arm not in exp.arms or any(src not in exp.arms for src in sources):
            raise ConfigError(f"{path}: gate_memory names an arm that is not in arms: {arm}: {sources}")
        if any(order.index(src) >= order.index(arm) for src in sources):
            raise ConfigError(f"{path}: gate_memory: the arms {arm} learns from must come before it in arms")
        if len(exp.seeds) < 2:
            raise ConfigError(f"{path}: gate_memory needs at least 2 seeds (an arm learns from the others)")
    base = Path(exp.base) if Path(exp.base).is_file() else path.parent / exp.base
    if not base.is_file():
        raise ConfigError(f"{path}: base config {exp.base} not found")
    return exp, base


def tiny_experiment(exp: ExperimentConfig, games_dir: Path) -> ExperimentConfig:
    """``--tiny``: ``exp`` at the smallest size that still trains every arm and writes every
    output: its first seed, each arm's overrides followed by ``TINY_RUN`` (an arm's own sizes
    shrink too) with the games generated into ``games_dir``, no gate memory (it needs two seeds:
    a gate with memory starts empty), the fewest bootstrap resamples the schema allows and a
    two-point sweep. What CI runs so that the experiment's command keeps working; the figures
    mean nothing."""
    tiny = [*TINY_RUN, f"env.games_dir={games_dir}"]
    small = exp.model_copy(
        update={
            "seeds": exp.seeds[:1],
            "arms": {arm: [*overrides, *tiny] for arm, overrides in exp.arms.items()},
            "gate_memory": {},
            "bootstrap": 100,
            "sweep": None if exp.sweep is None else SweepSpec(k=[2], tau="0.1,0.3"),
        }
    )
    small._layers = exp._layers
    return small
