"""What a trajectory stop rule would have done on logged rollouts, in sample and held out.

    python -m selective_rollout.analysis.trajectory_stop_eval --rollouts R.jsonl [...] --rule outlived \\
        [--param min_step=6 ...] [--grid min_step=4,5,6,7,8 ...] [--target 0.95] [--folds 2] \\
        [--gate stalled --gate-k 11 [--gate-param name=value ...]] --out DIR

Every labelled group of the logs (final rewards known, G >= 2, no trajectory whose reward was
assigned by a stop) is replayed: each trajectory is asked about at each of its steps s from
``min_step`` on while it was still running after s, with the group as it stood at step s in
lock-step (every trajectory's first s actions; a sibling has won when it won at a step <= s), and
the first stop counts. Its label is right when the logged final reward equals the assigned one,
and it saves the step-tokens the logged trajectory spent after the stop step.

Per rule setting (the ``--param`` values, and each combination of the ``--grid`` values): the
trajectories stopped and of those the right ones, the label precision with its exact 95%
(Clopper-Pearson) interval, the step-tokens saved as a share of all step-tokens of the evaluated
groups, and, over the groups with at least one wrong label that reach the learner, the GRPO
advantages it would have got against the true ones (the L2 norm of their difference, and the
trajectories whose advantage changes sign). With ``--grid`` a held-out row follows: the tasks are
dealt into ``--folds`` folds (as the gates' held-out evaluation deals them), and each fold is
evaluated with the setting that saves the most on the other folds while its label precision there
is >= ``--target`` (none such: the rule stays off on that fold).

With ``--gate``, the gate is replayed over the same groups (without audits, as
analysis/gate_eval/replay.py does) and the groups it would cut are left out before the rule's saving is
counted: the rule's saving on top of the gate, still as a share of all step-tokens, and its
precision in the groups the gate keeps (the held-out choice then looks at these).

Printed and written: ``trajectory_stops.md`` (the table) and ``trajectory_stops.csv``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from selective_rollout.analysis.gate_eval.evaluate import parse_param
from selective_rollout.analysis.gate_eval.heldout import split_by_task
from selective_rollout.analysis.gate_eval.replay import EPS, replay
from selective_rollout.gate.base import build_gate
from selective_rollout.gate.snapshot import labelled
from selective_rollout.plugins import TRAJECTORY_STOPS
from selective_rollout.records import REWARD_TOL, GroupRecord, TrajectoryStatus, read_groups
from selective_rollout.stats import clopper_pearson, grpo_advantages
from selective_rollout.trajectory_stop.base import NoStop, TrajectoryRule, TrajectoryView

Stop = tuple[int, float]  # (the step a trajectory is stopped at, its assigned reward)


def view_at(record: GroupRecord, index: int, step: int) -> TrajectoryView:
    """Group ``record`` as its trajectory ``index`` would see it at ``step`` in lock-step."""
    trajectories = record.trajectories
    return TrajectoryView(
        index=index,
        step=step,
        actions=[t.actions[:step] for t in trajectories],
        won=[t.won and len(t.steps) <= step for t in trajectories],
        ended=[len(t.steps) <= step for t in trajectories],
        g=record.g,
    )


def first_stop(rule: TrajectoryRule, record: GroupRecord, index: int) -> Stop | None:
    """Where the rule would first have stopped trajectory ``index`` of a logged group, if anywhere."""
    for step in range(1, len(record.trajectories[index].steps)):  # still running after ``step``
        if rule.due(step):
            reward = rule.decide(view_at(record, index, step))
            if reward is not None:
                return step, reward
    return None


@dataclass(frozen=True)
class GroupStops:
    """One logged group under one rule: where it stops each trajectory, and what that is worth."""

    task_id: str
    rewards: tuple[float, ...]  # the logged final rewards
    stops: tuple[Stop | None, ...]
    saved: tuple[int, ...]  # per trajectory, the step-tokens it spent after its stop step
    tokens: int  # the group's step-tokens
    gate_cut: bool = False  # the gate, when one is replayed, would have cut the group

    @property
    def stopped(self) -> int:
        return sum(s is not None for s in self.stops)

    @property
    def right(self) -> int:
        pairs = zip(self.stops, self.rewards, strict=True)
        return sum(s is not None and abs(s[1] - r) <= REWARD_TOL for s, r in pairs)

    def advantage_error(self) -> tuple[float, int]:
        """The L2 norm of (advantages with the assigned rewards - the true ones) and the number of
        trajectories whose advantage changes sign (0 and 0 when every label is right)."""
        kept = [r if s is None else s[1] for s, r in zip(self.stops, self.rewards, strict=True)]
        given, true = grpo_advantages(kept, EPS), grpo_advantages(self.rewards, EPS)
        return float(np.linalg.norm(given - true)), int(np.sum(given * true < 0))


def stops_in(
    rule: TrajectoryRule, groups: Sequence[GroupRecord], cut: Collection[int] = ()
) -> list[GroupStops]:
    """The rule over ``groups``; ``cut`` holds the ids of those the gate would cut (ids, since
    group ids repeat across the logs of several runs)."""
    out = []
    for record in groups:
        stops = tuple(first_stop(rule, record, i) for i in range(record.g))
        saved = tuple(
            0 if s is None else sum(t.step_tokens[s[0] :])
            for s, t in zip(stops, record.trajectories, strict=True)
        )
        rewards = tuple(float(r) for r in record.rewards)  # type: ignore[arg-type]
        gate_cut = id(record) in cut
        out.append(GroupStops(record.task_id, rewards, stops, saved, record.step_tokens, gate_cut))
    return out


def summarize(groups: Sequence[GroupStops]) -> dict[str, float]:
    """Precision (with its exact 95% interval), the share of step-tokens saved and the advantage
    error of a rule's stops over ``groups``, overall and in the groups the gate keeps."""
    total = sum(g.tokens for g in groups)
    kept = [g for g in groups if not g.gate_cut]
    wrong = [g.advantage_error() for g in kept if g.right < g.stopped]  # a cut group never trains
    return {
        "groups": float(len(groups)),
        "trajectories": float(sum(len(g.stops) for g in groups)),
        **_precision(groups, ""),
        "saved": sum(sum(g.saved) for g in groups) / total if total else math.nan,
        "wrong_groups": float(len(wrong)),
        "adv_l2_error": float(np.mean([e[0] for e in wrong])) if wrong else 0.0,
        "sign_flips": float(sum(e[1] for e in wrong)),
        "gate_cut": float(len(groups) - len(kept)),
        **_precision(kept, "kept_"),
        "kept_saved": sum(sum(g.saved) for g in kept) / total if total else math.nan,
    }


def _precision(groups: Sequence[GroupStops], prefix: str) -> dict[str, float]:
    stopped, right = sum(g.stopped for g in groups), sum(g.right for g in groups)
    low, high = clopper_pearson(right, stopped) if stopped else (math.nan, math.nan)
    precision = right / stopped if stopped else math.nan
    return {
        f"{prefix}stopped": float(stopped),
        f"{prefix}right": float(right),
        f"{prefix}precision": precision,
        f"{prefix}precision_lo": low,
        f"{prefix}precision_hi": high,
    }


@dataclass
class Row:
    label: str  # the setting, or the held-out choice per fold
    summary: dict[str, float]


def settings(fixed: Mapping[str, str], grid: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """Every combination of the grid's values over the fixed parameters (the fixed ones alone
    without a grid)."""
    combos = itertools.product(*grid.values())
    return [{**fixed, **dict(zip(grid, values, strict=True))} for values in combos]


def _label(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def heldout_row(
    name: str,
    grid_settings: Sequence[dict[str, str]],
    parts: Sequence[tuple[Sequence[GroupRecord], Sequence[GroupRecord]]],
    cut: Collection[int],
    target: float,
    gated: bool,
) -> Row:
    """Per part, the setting that saves the most on its fit groups at label precision >= target
    (in the groups the gate keeps when ``gated``), evaluated on its evaluation groups; pooled."""
    prefix = "kept_" if gated else ""
    pooled, chosen = [], []
    for fit, ev in parts:
        best, best_saved = None, -1.0
        for params in grid_settings:
            s = summarize(stops_in(_rule(name, params), fit, cut))
            ok = not math.isnan(s[f"{prefix}precision"]) and s[f"{prefix}precision"] >= target
            if ok and s[f"{prefix}saved"] > best_saved:
                best, best_saved = params, s[f"{prefix}saved"]
        chosen.append("no setting reaches the target: no stop" if best is None else _label(best))
        # with no setting precise enough on the fit part the rule stays off on the evaluated one
        pooled += stops_in(NoStop() if best is None else _rule(name, best), ev, cut)
    return Row(f"held out, chosen per fold: {'; '.join(chosen)}", summarize(pooled))


def _rule(name: str, params: Mapping[str, str]) -> TrajectoryRule:
    """The rule bound to ``params`` (strings from the command line; its model converts them)."""
    return TRAJECTORY_STOPS.get(name)(**params)  # type: ignore[no-any-return]


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def _precision_text(s: Mapping[str, float], prefix: str = "") -> str:
    p = s[f"{prefix}precision"]
    if math.isnan(p):
        return "n/a (no stop)"
    return f"{p:.2f} [{s[f'{prefix}precision_lo']:.2f}, {s[f'{prefix}precision_hi']:.2f}]"


def table(rows: Sequence[Row], gate: str | None) -> list[str]:
    head = (
        "| rule setting | stopped (right) | label precision [95% CI] | step-tokens saved | "
        "groups with a wrong label | advantage L2 error (mean) | sign flips |"
    )
    if gate:
        head += f" groups {gate} keeps: stopped (right) | precision | saved on top of {gate} |"
    lines = [head, "|" + "---|" * (10 if gate else 7)]
    for row in rows:
        s = row.summary
        line = (
            f"| {row.label} | {s['stopped']:.0f} ({s['right']:.0f}) | {_precision_text(s)} | "
            f"{_pct(s['saved'])} | {s['wrong_groups']:.0f} | {s['adv_l2_error']:.2f} | "
            f"{s['sign_flips']:.0f} |"
        )
        if gate:
            line += (
                f" {s['kept_stopped']:.0f} ({s['kept_right']:.0f}) | {_precision_text(s, 'kept_')} | "
                f"{_pct(s['kept_saved'])} |"
            )
        lines.append(line)
    return lines


def write_csv(rows: Sequence[Row], path: Path) -> None:
    fields = ["setting", *rows[0].summary]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for row in rows:
            values = {k: round(v, 6) for k, v in row.summary.items()}
            w.writerow({"setting": row.label, **values})


def _grid(text: str) -> tuple[str, list[str]]:
    key, values = parse_param(text)
    listed = [v.strip() for v in values.split(",") if v.strip()]
    if not listed:
        raise argparse.ArgumentTypeError(f"--grid must be name=v1,v2,..., got {text!r}")
    return key, listed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.analysis.trajectory_stop_eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rollouts", nargs="+", type=Path, required=True, help="rollouts.jsonl logs")
    parser.add_argument("--rule", required=True, help="a registered trajectory stop rule")
    parser.add_argument(
        "--param", type=parse_param, action="append", default=[], help="name=value (repeatable)"
    )
    parser.add_argument(
        "--grid", type=_grid, action="append", default=[], help="name=v1,v2,...: values to choose among"
    )
    parser.add_argument("--target", type=float, default=0.95, help="label precision to keep (held out)")
    parser.add_argument("--folds", type=int, default=2, help="task folds of the held-out choice (>= 2)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the task folds")
    parser.add_argument("--gate", help="a registered gate, replayed: the groups it cuts are left out")
    parser.add_argument("--gate-k", type=int, help="the gate's k (default: its own)")
    parser.add_argument("--gate-param", type=parse_param, action="append", default=[], help="name=value")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.target <= 1 or args.folds < 2:
        print("error: need 0 < --target <= 1 and --folds >= 2", file=sys.stderr)
        return 2
    fixed, grid = dict(args.param), dict(args.grid)
    try:
        grid_settings = settings(fixed, grid)
        rules = [(params, _rule(args.rule, params)) for params in grid_settings]  # refuses bad values
        logged = [g for p in args.rollouts for g in read_groups(p)]
        groups = [
            g
            for g in labelled(logged)
            if all(t.status is not TrajectoryStatus.STOPPED for t in g.trajectories)
        ]
        if not groups:
            raise ValueError("the logs hold no labelled group (final rewards known, G >= 2)")
        cut: set[int] = set()
        gate_line = ""
        if args.gate:
            gate_params = dict(args.gate_param) | ({} if args.gate_k is None else {"k": args.gate_k})
            outcomes = replay(build_gate(args.gate, **gate_params), groups)
            cut = {id(g) for g, o in zip(groups, outcomes, strict=True) if o.stopped}
            gate_saved = sum(o.saved for o in outcomes) / sum(o.total for o in outcomes)
            gate_line = (
                f" The gate {args.gate} ({_label(gate_params)}), replayed without audits, cuts "
                f"{len(cut)} of them and saves {_pct(gate_saved)} of their step-tokens; the rule's "
                "saving on top of it is counted in the groups it keeps."
            )
        rows = [Row(_label(params), summarize(stops_in(rule, groups, cut))) for params, rule in rules]
        if grid:
            tasks = {g.task_id for g in groups}
            if len(tasks) < args.folds:
                raise ValueError(f"{len(tasks)} task(s) cannot fill {args.folds} folds")
            parts = split_by_task(groups, args.folds, args.seed)
            rows.append(heldout_row(args.rule, grid_settings, parts, cut, args.target, bool(args.gate)))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header = [
        f"Trajectory stop rule `{args.rule}` on {', '.join(map(str, args.rollouts))}: {len(groups)} labelled "
        f"groups of {len({g.task_id for g in groups})} tasks, {sum(g.g for g in groups)} trajectories, "
        f"{sum(g.step_tokens for g in groups)} step-tokens, replayed in lock-step.{gate_line}",
        "Saved: step-tokens after the stop steps, as a share of all step-tokens of these groups."
        + (f" Held out: {args.folds} task folds, target label precision {args.target:g}." if grid else ""),
        "",
    ]
    text = "\n".join(header + table(rows, args.gate)) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trajectory_stops.md").write_text(text)
    write_csv(rows, args.out / "trajectory_stops.csv")
    print(text, end="")
    print(f"wrote {args.out / 'trajectory_stops.md'} and trajectory_stops.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
