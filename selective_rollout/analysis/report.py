"""The run report: what a user reads first. Built from metrics.jsonl and rollouts.jsonl.

It states only what the run measured. Step-tokens a cut group would still have needed are
unknown by construction; the report estimates them only from audited groups (gate stops that
ran on in shadow) and says so, and points to ``bench/rollout_ab.py`` for a measured A/B.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selective_rollout.analysis.offpolicy import offpolicy_rows, offpolicy_summary, outcomes_by_lag
from selective_rollout.analysis.policy_eval import describe_gain, success_gain
from selective_rollout.placement import nodes_by_kind, placement_lines, read_placement
from selective_rollout.records import GroupRecord, Outcome, read_groups
from selective_rollout.reporting.idle import throughput_summary
from selective_rollout.reporting.metrics_log import read_metrics
from selective_rollout.stats import clopper_pearson

if TYPE_CHECKING:
    from selective_rollout.driver import Driver

RSS_PREFIX = "system/rss_gb/"


def saving_estimate(groups: Sequence[GroupRecord]) -> tuple[float, str]:
    """Step-tokens the gate's cuts saved, and the basis of the estimate in words.

    What a cut group would still have spent is unknown by construction. The best witnesses are
    audited groups (stops that ran on in shadow: the same gate, the same kind of group); without
    any, each cut is matched with the whole groups of its task type (all of them when its type
    never ran to the end), counting what those spent after the cut's gate step.
    """
    cut = [g for g in groups if g.outcome is Outcome.CUT and g.gate is not None]
    if not cut:
        return 0.0, "no group was cut"
    audited = [g for g in groups if g.outcome is Outcome.AUDITED and g.gate is not None]
    if audited:
        mean_after = sum(g.tokens_after(g.gate.step) for g in audited) / len(audited)
        return mean_after * len(cut), (
            f"from {len(audited)} audited group(s): the step-tokens they spent after their gate step, per cut"
        )
    whole = [g for g in groups if g.zero_variance is not None]
    if not whole:
        return 0.0, "not estimable: no group ran to the end"
    saved, by_type = 0.0, 0
    for g in cut:
        peers = [w for w in whole if w.task_type == g.task_type]
        by_type += bool(peers)
        peers = peers or whole
        saved += sum(w.tokens_after(g.gate.step) for w in peers) / len(peers)
    return saved, (
        f"no audited group: from what whole groups of the same task type spent after the gate step "
        f"({by_type} of {len(cut)} cuts matched by type, the rest by all whole groups)"
    )


def peak_memory(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Largest resident memory of each kind of process over the run, GB (``system/rss_gb/<kind>_<i>``:
    the engines' largest, the learners' largest, the coordinator, the driver), in first-logged order."""
    peaks: dict[str, float] = {}
    for m in metrics:
        for key, value in m.items():
            if key.startswith(RSS_PREFIX):
                kind = key[len(RSS_PREFIX) :].rstrip("0123456789").rstrip("_")
                peaks[kind] = max(peaks.get(kind, 0.0), float(value))
    return peaks


def rollout_summary(groups: Sequence[GroupRecord]) -> dict[str, Any]:
    """Counts, zero-variance share, gate precision and savings over the run's training groups."""
    train = [g for g in groups if g.iteration >= 0]
    outcomes = {o.value: sum(g.outcome is o for g in train) for o in Outcome}
    labelled = [g for g in train if g.zero_variance is not None]
    audited = [g for g in train if g.outcome is Outcome.AUDITED]
    cut = [g for g in train if g.outcome is Outcome.CUT]
    kept = [g for g in train if g.trained_on]
    spent = sum(g.step_tokens for g in train)
    hits = sum(bool(g.zero_variance) for g in audited)
    saved, basis = saving_estimate(train)
    stops = [t for g in train for t in g.trajectories if t.stop is not None]
    labels = [t.label_right for t in stops if t.label_right is not None]
    return {
        "groups": len(train),
        "outcomes": outcomes,
        "zero_var_frac": sum(bool(g.zero_variance) for g in labelled) / len(labelled) if labelled else None,
        "kept": len(kept),
        "informative_kept": sum(g.zero_variance is False for g in kept),
        "gate_fires": sum(1 for g in train if g.gate is not None and g.gate.stop),
        "step_tokens_spent": spent,
        "step_tokens_in_cut_groups": sum(g.step_tokens for g in cut),
        # what cut groups spent after their gate step (trajectories ahead of the decision): 0 with
        # rollout.hold_at_gate, the overshoot of the concurrent scheduler without it
        "step_tokens_past_cut": sum(g.tokens_after(g.gate.step) for g in cut if g.gate is not None),
        "audited": len(audited),
        "audit_precision": hits / len(audited) if audited else None,
        "audit_precision_ci95": list(clopper_pearson(hits, len(audited))) if audited else None,
        "audit_step_tokens": sum(g.tokens_after(g.gate.step) for g in audited if g.gate is not None),
        # online, a stopped group's class is known only when it was audited
        "audited_by_class": {
            "all-fail": sum(g.reward_class == "all-fail" for g in audited),
            "all-succeed": sum(g.reward_class == "all-succeed" for g in audited),
            "informative": sum(g.reward_class == "mixed" for g in audited),
        },
        # trajectory stops: ended early with an assigned reward, or run on in shadow (audited)
        "trajectory_stops": {
            "stopped": sum(not t.stop.audited for t in stops),  # type: ignore[union-attr]
            "audited": len(labels),
            "label_right": sum(labels),
        },
        "step_tokens_saved_est": saved,
        "step_tokens_saved_frac_est": saved / (spent + saved) if spent + saved else 0.0,
        "step_tokens_saved_basis": basis,
    }


def regime_summary(groups: Sequence[GroupRecord], k: int) -> dict[str, Any]:
    """Is this run in the method's regime (many zero-variance groups, long trajectories)? Over
    the groups that ran to the end:
    the all-fail and all-succeed shares, the median trajectory length, and how many distinct
    values D_K takes at step ``k`` (``RunConfig.regime_k``: the gate's step unless the profile
    names another; a divergence gate needs a spread of D_K to measure anything)."""
    from selective_rollout.gate import prefix_edit_distance

    whole = [g for g in groups if g.iteration >= 0 and g.zero_variance is not None and g.g >= 2]
    lengths = [len(t.steps) for g in whole for t in g.trajectories]
    rewards = [{t.reward for t in g.trajectories} for g in whole]
    d_k = {round(prefix_edit_distance([t.actions for t in g.trajectories], k), 6) for g in whole}
    n = len(whole)
    return {
        "groups": n,
        "k": k,
        "all_fail_frac": sum(r == {0.0} for r in rewards) / n if n else None,
        "all_succeed_frac": sum(r == {1.0} for r in rewards) / n if n else None,
        "median_trajectory_steps": float(statistics.median(lengths)) if lengths else None,
        "d_k_distinct": len(d_k),
    }


def _fmt(value: Any, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.1%}" if pct else (f"{value:,.0f}" if isinstance(value, (int, float)) else str(value))


def plot_run(metrics: list[dict[str, Any]], groups: Sequence[GroupRecord], out: Path) -> list[Path]:
    """PNG plots: success, groups cut/kept, step-tokens, wall per iteration, D_K histogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [m for m in metrics if m["iteration"] >= 0 and "rollout/wall_s" in m]
    x = [m["iteration"] for m in its]
    paths = []

    def series(key: str) -> list[float]:
        return [m.get(key) or 0.0 for m in its]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    ax.plot(x, series("rollout/success_rate"), marker="o", label="train rollouts (sampled)")
    evals = [m for m in metrics if m.get("eval/success_rate") is not None]
    if evals:
        ax.errorbar(
            [m["iteration"] for m in evals],
            [m["eval/success_rate"] for m in evals],
            yerr=[
                [m["eval/success_rate"] - m["eval/success_ci_low"] for m in evals],
                [m["eval/success_ci_high"] - m["eval/success_rate"] for m in evals],
            ],
            marker="s",
            capsize=4,
            label="held-out (95% CI)",
        )
    ax.set_title("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for key, label in (
        ("rollout/groups_trained", "trained on"),
        ("rollout/groups_cut", "cut by gate"),
        ("rollout/groups_filtered", "filtered"),
        ("rollout/groups_audited", "audited"),
    ):
        ax.plot(x, series(key), marker="o", label=label)
    ax.set_title("groups per iteration")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.bar(x, series("rollout/step_tokens"))
    ax.set_title("rollout step-tokens per iteration")
    ax = axes[1][1]
    ax.bar(x, series("system/iteration_s"), label="iteration")
    ax.plot(x, series("rollout/wall_s"), color="C1", marker="o", label="rollout")
    ax.set_title("wall-clock per iteration (s)")
    ax.legend(fontsize=8)
    for a in axes.flat:
        a.set_xlabel("iteration")
        a.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "training_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    decided = [g for g in groups if g.gate is not None and "prefix_edit_distance" in g.gate.features]
    if decided:
        fig, ax = plt.subplots(figsize=(7, 4))
        buckets = {
            "cut / audited": [g for g in decided if g.gate.stop],
            "kept, zero variance": [g for g in decided if not g.gate.stop and g.zero_variance],
            "kept, mixed rewards": [g for g in decided if not g.gate.stop and g.zero_variance is False],
        }
        data = [[g.gate.features["prefix_edit_distance"] for g in v] for v in buckets.values()]
        ax.hist(data, bins=20, range=(0, 1), stacked=True, label=list(buckets))
        ax.set_xlabel("D_K (prefix edit distance at the gate step)")
        ax.set_ylabel("groups")
        ax.set_title("D_K at the gate decision")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "dk_histogram.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def throughput_rows(throughput: dict[str, float] | None) -> list[str]:
    """The report's rows on idle hardware and delivery (``reporting.idle``)."""
    if throughput is None:
        return ["| hardware waiting | not recorded (a run logged before system/engine_busy_s) |"]
    return [
        f"| hardware waiting | engines {throughput['engine_wait_frac']:.0%} of their time (no request "
        f"in flight), learners {throughput['learner_wait_frac']:.0%} (outside the optimiser step) |",
        f"| delivered | {throughput['informative_groups_per_hour']:.1f} informative groups trained per "
        f"hour of iterations; {throughput['trained_tokens_per_engine_s']:.1f} trained tokens per "
        "engine-second |",
        f"| learner | {throughput['learner_step_s']:.1f} s a step, "
        f"{throughput['trained_tokens_per_iteration']:.0f} trained tokens per iteration |",
    ]


def write_report(
    run_dir: Path,
    state: dict[str, Any],
    regime_k: int,
    pipeline: str = "sync",
    max_staleness: int = 1,
) -> Path:
    """Write report.md, report.json and the plots into ``run_dir``; return report.md's path.
    ``regime_k`` is the step at which the regime's D_K spread is measured (``RunConfig.regime_k``);
    ``pipeline`` and ``max_staleness`` are the run's ``driver.*`` settings."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    rollouts = run_dir / "rollouts.jsonl"
    groups = list(read_groups(rollouts)) if rollouts.is_file() else []
    summary = rollout_summary(groups)
    regime = regime_summary(groups, regime_k)
    evals = state.get("eval", {})
    plots = plot_run(metrics, groups, run_dir)
    by_lag, offpolicy = outcomes_by_lag(groups, metrics), offpolicy_summary(metrics)
    located = read_placement(run_dir)
    placement = nodes_by_kind(located)
    report = {
        "run": run_dir.name,
        "iterations": state.get("iteration", 0),
        "wall_s": state.get("wall_s", 0.0),
        # the rollout share of the iterations (learner, weight sync and evaluation excluded)
        "rollout_wall_s": sum(
            m["rollout/wall_s"] for m in metrics if m["iteration"] >= 0 and "rollout/wall_s" in m
        ),
        "rollout": summary,
        "regime": regime,
        "eval": evals,
        "plots": [p.name for p in plots],
        "placement": placement,
        "peak_rss_gb": peak_memory(metrics),
        "throughput": throughput_summary(metrics, summary["informative_kept"], state.get("wall_s", 0.0)),
        "pipeline": {
            "kind": pipeline,
            "max_staleness": max_staleness,
            "outcomes_by_lag": by_lag,
            **(offpolicy or {}),
        },
    }
    before, after = evals.get("before"), evals.get("after")
    gain = success_gain(before, after) if before and after else None
    change = (
        describe_gain(gain)
        + (
            f"; a try's before and after outcomes correlate {gain['try_correlation']:+.2f} within tasks"
            if gain.get("try_correlation") is not None
            else ""
        )
        if gain
        else "not measured: no evaluation before and after on the same tasks"
    )
    report["eval_gain"] = gain
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))

    def success(e: dict[str, Any] | None) -> str:
        if not e:
            return "n/a"
        return f"{e['success_rate']:.1%} (95% CI {e['ci95'][0]:.1%}..{e['ci95'][1]:.1%}, {e['tasks']} tasks)"

    o = summary["outcomes"]
    ci = summary["audit_precision_ci95"]
    by_class = ", ".join(f"{n} {kind}" for kind, n in summary["audited_by_class"].items())
    precision = (
        f"{summary['audit_precision']:.1%} (95% CI {ci[0]:.1%}..{ci[1]:.1%}, {summary['audited']} audited: "
        f"{by_class}; {_fmt(summary['audit_step_tokens'])} step-tokens spent on audit)"
        if ci
        else "not measured: " + ("no audit budget" if summary["gate_fires"] else "the gate never fired")
    )
    whole = regime["groups"]
    regime_row = (
        f"{whole} whole groups: all-fail {regime['all_fail_frac']:.1%}, all-succeed "
        f"{regime['all_succeed_frac']:.1%}; median trajectory {regime['median_trajectory_steps']:.0f} steps; "
        f"D_{regime['k']} takes {regime['d_k_distinct']} distinct values"
        if whole
        else "no group ran to the end"
    )
    ts = summary["trajectory_stops"]
    stops_row = f"{ts['stopped']} trajectories ended early with an assigned reward; " + (
        f"{ts['label_right']} of {ts['audited']} audited labels right"
        if ts["audited"]
        else "labels not measured (no audit)"
    )
    prefix = "gate/state/"
    state = {k.removeprefix(prefix): v for m in metrics for k, v in m.items() if k.startswith(prefix)}
    state_row = (
        ", ".join(f"{key} {value:g}" for key, value in state.items())
        + " (what the gate set from the run's labelled groups, at the last iteration)"
    )
    memory_row = (
        ", ".join(f"{kind} {gb:.1f} GB" for kind, gb in report["peak_rss_gb"].items())
        + " (the largest process of each kind, sampled at the end of each iteration)"
        if report["peak_rss_gb"]
        else "not recorded (a run logged before system/rss_gb/*)"
    )
    lines = [
        f"# Run report: {run_dir.name}",
        "",
        "| | |",
        "|---|---|",
        f"| iterations | {report['iterations']} |",
        f"| wall-clock | {report['wall_s']:.0f} s (rollouts {report['rollout_wall_s']:.0f} s) |",
        f"| groups started | {summary['groups'] - o['skipped']} (ran whole {o['completed']}, cut {o['cut']}, "
        f"audited {o['audited']}, filtered {o['filtered']}, failed {o['failed']}, skipped {o['skipped']}) |",
        f"| groups trained on | {summary['kept']} ({summary['informative_kept']} informative) |",
        f"| zero-variance share (groups with a known outcome) | {_fmt(summary['zero_var_frac'], True)} |",
        f"| regime | {regime_row} |",
        f"| gate fires | {summary['gate_fires']} (cut groups spent {_fmt(summary['step_tokens_past_cut'])} "
        "step-tokens past their gate step) |",
        f"| audited gate precision | {precision} |",
        *([f"| gate's own state | {state_row} |"] if state else []),
        *([f"| trajectory stops | {stops_row} |"] if ts["stopped"] or ts["audited"] else []),
        f"| rollout step-tokens spent | {_fmt(summary['step_tokens_spent'])} |",
        f"| step-tokens saved by the gate (estimate) | {_fmt(summary['step_tokens_saved_est'])} "
        f"({_fmt(summary['step_tokens_saved_frac_est'], True)} of what the run would have spent; "
        f"{summary['step_tokens_saved_basis']}) |",
        *throughput_rows(report["throughput"]),
        *offpolicy_rows(offpolicy, pipeline, max_staleness, by_lag),
        f"| peak resident memory | {memory_row} |",
        f"| held-out success before | {success(before)} |",
        f"| held-out success after | {success(after)} |",
        f"| held-out change (after - before, paired per task) | {change} |",
        "",
        "Wall-clock saved by the gate is not measurable inside one run: compare arms on one task stream",
        "with `python bench/rollout_ab.py` or `python -m selective_rollout.analysis.experiment`.",
        "",
    ]
    if after and after.get("by_type"):
        lines += [
            "## Held-out success by task type (after)",
            "",
            "| task type | success | tasks |",
            "|---|---|---|",
        ]
        lines += [f"| {k} | {v['success_rate']:.1%} | {v['tasks']} |" for k, v in after["by_type"].items()]
        lines.append("")
    lines += placement_lines(located)
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def report_run(driver: Driver) -> Path:
    """The report of the run ``driver`` has just finished (``Driver.run``); returns report.md's path.
    The driver does not write it itself (the report is analysis, a layer above the driver): the
    command line, the experiment runner and the end-to-end tests call this after the run."""
    settings = driver.cfg.driver
    return write_report(
        driver.run_dir, driver.state, driver.cfg.regime_k, settings.pipeline, settings.max_staleness
    )
