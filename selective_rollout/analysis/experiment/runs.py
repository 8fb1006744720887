"""Running an experiment's arms: every arm on every seed as a full training run (the driver, in
this process), a finished run read back instead of trained again, each run's figures from its
report, then the outputs (``markdown``) and the pooled offline gate sweep."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from selective_rollout.analysis.experiment.markdown import write_outputs
from selective_rollout.analysis.experiment.schema import (
    ExperimentConfig,
    SweepSpec,
    load_experiment,
    tiny_experiment,
)
from selective_rollout.analysis.report import report_run
from selective_rollout.config import ConfigError, RunConfig, load_config
from selective_rollout.reporting.metrics_log import read_metrics

log = logging.getLogger("selective_rollout.analysis.experiment")


def run_arm(
    cfg: RunConfig,
    run_dir: Path,
    keep_checkpoints: bool = False,
    before_eval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One training run, or the finished run already in ``run_dir`` when its config is identical
    (an interrupted experiment resumes: finished arms are read back, a partial one resumes from
    its last checkpoint); returns the run's experiment metrics. ``before_eval``: the held-out
    summary of the starting weights when already known (``Driver``). A finished arm's
    checkpoints are deleted unless ``keep_checkpoints``: nothing in the experiment reads them
    again, and ten arms of the CPU profile would otherwise hold ~30 GB."""
    from selective_rollout.driver import Driver

    if finished_run(run_dir, cfg):
        log.info("reusing the finished run in %s (same config)", run_dir)
        return arm_metrics(run_dir)
    driver = Driver(cfg, run_dir, before_eval=before_eval)
    try:
        driver.run()
        report_run(driver)
    finally:
        driver.close()
    metrics = arm_metrics(run_dir)
    if not keep_checkpoints and finished_run(run_dir, cfg):
        shutil.rmtree(driver.ckpt_dir, ignore_errors=True)
    return metrics


def before_eval_key(cfg: RunConfig) -> str:
    """What decides a run's held-out 'before' score: its evaluation config (the arm's rollout
    strategy, refill and audit are already neutralised there) without the sections that act only
    once training starts (gate, trainer, driver, logging) and the run's name. Two runs with one
    key start from the same weights and play the same held-out episodes."""
    from selective_rollout.rollout.coordinator import evaluation_config

    dump = evaluation_config(cfg).model_dump(
        mode="json", exclude={"gate", "trainer", "driver", "logging", "name"}
    )
    return json.dumps(dump, sort_keys=True)


def finished_run(run_dir: Path, cfg: RunConfig) -> bool:
    """True when ``run_dir`` holds a complete run of exactly ``cfg``; a different config is an error.

    The ``placement`` section and ``driver.run_dir`` are left out of the comparison: they say where
    the actors run, on which allocator and into which folder, not what they compute, so an
    experiment resumed on another cluster layout (or with ``placement.engine_allocator`` changed to
    get past an out-of-memory kill), or a run copied from another experiment's folder where an arm
    of the same config ran, is the same run."""
    saved, report = run_dir / "config.yaml", run_dir / "report.json"
    if not saved.is_file():
        return False
    ran = RunConfig.model_validate(yaml.safe_load(saved.read_text()))
    where = {"placement": True, "driver": {"run_dir"}}
    if ran.model_dump(exclude=where) != cfg.model_dump(exclude=where):
        raise ConfigError(f"{run_dir} holds a run of a different config: pass another --out")
    if not report.is_file():
        return False
    done = json.loads(report.read_text())
    return done.get("iterations") == cfg.driver.iterations and "after" in done.get("eval", {})


def arm_metrics(run_dir: Path) -> dict[str, Any]:
    """The experiment's metrics of one finished run, from its report.json and, for the training
    curve (success, loss), its metrics.jsonl."""
    report = json.loads((run_dir / "report.json").read_text())
    r, ev = report["rollout"], report["eval"]
    curve = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    played = [m["rollout/success_rate"] for m in curve if "rollout/success_rate" in m]
    trained = [m for m in curve if "train/loss" in m]
    # importance weights exist only where a run trained stale tokens (driver.pipeline async, stream)
    weights = report.get("pipeline") or {}
    weighted = "is_truncated_frac" in weights
    informative = r["informative_kept"]
    stops = r.get("trajectory_stops", {})  # a report written before trajectory stops has none
    throughput = report.get("throughput") or {}  # a report written before the idle figures has none
    return {
        "wall_s": report["wall_s"],
        "s_per_iteration": report["wall_s"] / report["iterations"] if report["iterations"] else None,
        "informative_per_hour": throughput.get("informative_groups_per_hour"),
        "engine_wait_frac": throughput.get("engine_wait_frac"),
        "learner_wait_frac": throughput.get("learner_wait_frac"),
        "learner_step_s": throughput.get("learner_step_s"),
        "trained_tokens_per_iteration": throughput.get("trained_tokens_per_iteration"),
        "rollout_wall_s": report["rollout_wall_s"],
        "step_tokens": r["step_tokens_spent"],
        "groups_cut": r["outcomes"]["cut"],
        "groups_stale": r["outcomes"].get("stale", 0),  # none in a report written before the outcome
        "groups_kept": r["kept"],
        "informative_kept": informative,
        "rollout_s_per_informative": report["rollout_wall_s"] / informative if informative else None,
        "step_tokens_per_informative": r["step_tokens_spent"] / informative if informative else None,
        "audit_precision": r["audit_precision"],
        "audits": r["audited"],
        "audits_right": round(r["audit_precision"] * r["audited"]) if r["audited"] else 0,
        # a report written before audits were counted by class has no such entry
        "audited_all_fail": r.get("audited_by_class", {}).get("all-fail"),
        "audited_all_succeed": r.get("audited_by_class", {}).get("all-succeed"),
        "trajectories_stopped": stops.get("stopped", 0),
        "trajectory_label_precision": stops["label_right"] / stops["audited"]
        if stops.get("audited")
        else None,
        "trajectory_stops_audited": stops.get("audited", 0),
        "trajectory_labels_right": stops.get("label_right", 0),
        "zero_var_frac": r["zero_var_frac"],
        "success_before": ev.get("before", {}).get("success_rate"),
        "success_after": ev.get("after", {}).get("success_rate"),
        "success_gain": (report.get("eval_gain") or {}).get("mean"),
        "success_gain_ci_low": ((report.get("eval_gain") or {}).get("ci95") or [None])[0],
        "train_success": sum(played) / len(played) if played else None,
        "train_success_last": played[-1] if played else None,
        "loss_abs_max": max((abs(m["train/loss"]) for m in trained), default=None),
        "grad_norm_max": max((m["train/grad_norm"] for m in trained if "train/grad_norm" in m), default=None),
        "is_within_cap": 1.0 - weights["is_truncated_frac"] if weighted else None,
        "ess_min": weights.get("ess_min") if weighted else None,
    }


def paired_cut_precision(reference: Path, run: Path) -> dict[str, Any]:
    """The gate's precision without an audit: of ``run``'s cut groups, the share whose task ended
    with one reward for all in the same iteration of the ``reference`` run (the ungated arm on
    the same task stream). Cuts of tasks the reference did not run in that iteration (its stream
    diverged, e.g. after a refill) are left out; ``cuts_matched`` says how many were compared."""
    from selective_rollout.records import Outcome, read_groups

    outcome = {
        (g.iteration, g.task_id): g.reward_class
        for g in read_groups(reference / "rollouts.jsonl")
        if g.reward_class is not None
    }
    matched = [
        outcome[(g.iteration, g.task_id)]
        for g in read_groups(run / "rollouts.jsonl")
        if g.outcome is Outcome.CUT and (g.iteration, g.task_id) in outcome
    ]
    right = sum(kind != "mixed" for kind in matched)
    return {
        "cuts_matched": len(matched),
        "paired_cut_precision": right / len(matched) if matched else None,
        "false_cuts": len(matched) - right,
        "cuts_all_fail": matched.count("all-fail"),
        "cuts_all_succeed": matched.count("all-succeed"),
    }


def pooled_sweep(out: Path, sweep: SweepSpec, run_dirs: list[Path]) -> None:
    """The offline K x tau gate sweep over every arm's logged rollouts, pooled."""
    from selective_rollout.analysis.gate_eval.evaluate import main as gate_evaluate

    pooled = out / "pooled_rollouts.jsonl"
    with pooled.open("w") as fh:
        for d in run_dirs:
            src = d / "rollouts.jsonl"
            if src.is_file():
                fh.write(src.read_text())
    ks = ",".join(map(str, sweep.k))
    gate_evaluate(["--rollouts", str(pooled), "--out", str(out / "sweep"), "--k", ks, "--tau", sweep.tau])


def run_overrides(
    exp: ExperimentConfig, out: Path, arm: str, seed: int, written_memory_only: bool = False
) -> list[list[str]]:
    """The overrides of ``arm`` on ``seed``, as layers (``load_config``'s): the experiment's, then
    the arm's with its gate memory (the logs of its ``gate_memory`` arms on every other seed), the
    seed and the run folder. An arm that selects another entry (``gate.name=any``) so replaces the
    shared overrides' keys of the one it replaces. ``written_memory_only``: leave out the memory
    logs not written yet (a dry run, before the arms that write them have run)."""
    run_dir = out / f"{arm}-s{seed}"
    memory = [
        str(out / f"{src}-s{other}" / "rollouts.jsonl")
        for src in exp.gate_memory.get(arm, [])
        for other in exp.seeds
        if other != seed
    ]
    if written_memory_only:
        memory = [path for path in memory if Path(path).is_file()]
    return [
        *exp.layers(),
        [
            *exp.arms[arm],
            *([f"gate.observe_logs=[{','.join(memory)}]"] if memory else []),
            f"seed={seed}",
            f"driver.task_shuffle_seed={seed}",
            f"name={arm}-s{seed}",
            f"driver.run_dir={run_dir}",
        ],
    ]


def prepare(
    path: str | Path,
    out: Path | None,
    tiny: bool,
    seeds: Sequence[int] | None = None,
    arms: Sequence[str] | None = None,
) -> tuple[ExperimentConfig, Path, Path]:
    """The experiment file loaded (shrunk by ``tiny_experiment`` with ``tiny``; with ``seeds`` or
    ``arms``, only those of its seeds and arms), its base run config and its output folder:
    ``out``, else ``runs/experiment-<name>`` (``-tiny`` appended with ``tiny``, so a tiny run never
    meets the real experiment's runs)."""
    exp, base = load_experiment(path)
    if arms is not None:
        exp = select_arms(exp, arms, path)
    if seeds is not None:
        unknown = sorted(set(seeds) - set(exp.seeds))
        if unknown or not seeds:
            raise ValueError(f"--seeds {list(seeds)}: the experiment's seeds are {exp.seeds}")
        if exp.gate_memory:
            raise ValueError(
                f"--seeds: {path} gives arms a gate memory of the other seeds' runs "
                "(gate_memory), which a subset of seeds would change; run every seed"
            )
        exp = exp.model_copy(update={"seeds": [s for s in exp.seeds if s in set(seeds)]})
    out = out or Path("runs") / f"experiment-{exp.name}{'-tiny' if tiny else ''}"
    return (tiny_experiment(exp, out / "games") if tiny else exp), base, out


def select_arms(exp: ExperimentConfig, arms: Sequence[str], path: str | Path) -> ExperimentConfig:
    """``exp`` with only ``arms``, in the file's order (so its first kept arm is the reference the
    others pair with); refused where a kept arm needs one left out (its gate memory, a ``versus``
    comparison) or fewer than two would remain."""
    unknown = sorted(set(arms) - set(exp.arms))
    kept = [arm for arm in exp.arms if arm in set(arms)]
    if unknown or len(kept) < 2:
        raise ValueError(f"--arms {list(arms)}: name at least two of the experiment's arms {list(exp.arms)}")
    needed = {src for arm in kept for src in exp.gate_memory.get(arm, [])} | set(exp.versus)
    if missing := sorted(needed - set(kept)):
        raise ValueError(
            f"--arms: {path} compares or remembers arms {missing} (versus, gate_memory); keep them too"
        )
    return exp.model_copy(update={"arms": {arm: exp.arms[arm] for arm in kept}})


def plan_experiment(
    path: str | Path,
    out: Path | None = None,
    tiny: bool = False,
    seeds: Sequence[int] | None = None,
    arms: Sequence[str] | None = None,
) -> list[str]:
    """``--dry-run``: one line per run the experiment would train, each run's config built and
    validated as the run builds it; nothing is trained or written. A gate memory's logs that its
    earlier arms have not written yet are left out of the config checked."""
    exp, base, out = prepare(path, out, tiny, seeds, arms)
    lines = []
    for arm in exp.arms:
        for seed in exp.seeds:
            cfg = load_config(base, layers=run_overrides(exp, out, arm, seed, written_memory_only=True))
            rc = cfg.rollout
            lines.append(
                f"{cfg.name}: {cfg.driver.iterations} iteration(s) of {rc.groups_per_iteration} groups of "
                f"G = {rc.group_size}, {rc.max_steps} steps, {cfg.env.name} {cfg.env.model_extra or {}}, "
                f"strategy {rc.strategy}, gate {cfg.gate.name}, "
                f"{cfg.eval.num_tasks} held-out tasks x {cfg.eval.tries} -> {cfg.driver.run_dir}"
            )
    return lines


def run_experiment(
    path: str | Path,
    out: Path | None = None,
    tiny: bool = False,
    seeds: Sequence[int] | None = None,
    arms: Sequence[str] | None = None,
) -> Path:
    """Every arm on every seed (``seeds``, ``arms``: only those), then the outputs (the module's
    doc); returns experiment.md."""
    exp, base, out = prepare(path, out, tiny, seeds, arms)
    out.mkdir(parents=True, exist_ok=True)
    rows, run_dirs = [], []
    evals_by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    reference = next(iter(exp.arms))
    known_before: dict[str, dict[str, Any]] = {}
    # arm after arm, each over every seed: an arm's reference and gate-memory sources have run
    # on every seed before it starts
    for arm in exp.arms:
        for seed in exp.seeds:
            run_dir = out / f"{arm}-s{seed}"
            cfg = load_config(base, layers=run_overrides(exp, out, arm, seed))
            key = before_eval_key(cfg)
            before = known_before.get(key) if exp.share_before_eval else None
            log.info(
                "experiment %s: arm %s, seed %d -> %s%s",
                exp.name,
                arm,
                seed,
                run_dir,
                " (held-out 'before' known from an earlier arm)" if before else "",
            )
            row = {"arm": arm, "seed": seed, **run_arm(cfg, run_dir, exp.keep_checkpoints, before)}
            evals = json.loads((run_dir / "report.json").read_text())["eval"]
            known_before.setdefault(key, evals["before"])
            if arm != reference:  # the reference arm ran first on this seed
                row.update(paired_cut_precision(out / f"{reference}-s{seed}", run_dir))
            rows.append(row)
            run_dirs.append(run_dir)
            evals_by_arm.setdefault(arm, {})[seed] = {"tries": cfg.eval.tries, **evals}
    write_outputs(out, exp, rows, evals_by_arm)
    if exp.sweep is not None:
        pooled_sweep(out, exp.sweep, run_dirs)
    return out / "experiment.md"
