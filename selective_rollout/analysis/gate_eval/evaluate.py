"""Offline evaluation of gates on logged rollouts (``rollouts.jsonl``).

For every gate and (K, threshold) it answers the questions a user asks before turning the gate on:
how many groups would it cut (TP/FP/FN), how precise is it, how well does D_K rank groups
(AUROC, Spearman against non-zero variance), how many rollout step-tokens would it save, what
fraction of the oracle's savings is that, and how much of the GRPO advantage signal survives.

Only groups whose final rewards are known are evaluated (completed, filtered or audited ones);
a group cut without audit has no label.

Any registered gate can be evaluated: ``--tau`` sweeps the parameter the gate names as its
``threshold`` (prefix_edit: tau, two_axis: d_low; the ``tau`` column holds its value), its other
parameters keep their defaults unless ``--param name=value`` (or ``--t-high``) sets them, and a
gate without a threshold is evaluated once per K.

Usage: python -m selective_rollout.analysis.gate_eval.evaluate --rollouts FILE --out DIR [--k 5,10,15]
       [--tau 0.02:0.30:0.02] [--gates prefix_edit,two_axis] [--t-high 0.9] [--param name=value ...]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu, spearmanr

from selective_rollout.gate.base import Gate, GroupView, build_gate, gate_class
from selective_rollout.gate.distance import prefix_edit_distance
from selective_rollout.records import GroupRecord, read_groups, rewards_equal
from selective_rollout.stats import grpo_advantages

EPS = 1e-6  # the trainer's default advantage_eps


@dataclass
class LabelledGroup:
    """A logged group reduced to what gate evaluation needs."""

    actions: list[list[str]]
    ended: list[bool]
    step_tokens: list[list[int]]
    rewards: list[float]

    @property
    def zero_variance(self) -> bool:
        return rewards_equal(self.rewards)

    @property
    def total_tokens(self) -> int:
        return sum(sum(t) for t in self.step_tokens)

    def live_after(self, k: int) -> bool:
        """Whether any trajectory was still running after K actions. The coordinator consults the
        gate only then (a group that is already over has nothing left to save), so offline
        evaluation does the same."""
        return any(len(a) > k for a in self.actions)

    def tokens_after(self, k: int) -> int:
        """Step-tokens the group spends after step k: what a cut at k saves."""
        return sum(sum(t[k:]) for t in self.step_tokens)

    @property
    def succeeded(self) -> bool:
        """A zero-variance group whose one reward is positive (all-succeed, not all-fail)."""
        return self.zero_variance and self.rewards[0] > 0

    def advantage_sq(self) -> float:
        """Squared L2 norm of the group's GRPO advantages, by the trainer's own formula
        (``stats.grpo_advantages``: sample std, the trainer's default eps)."""
        return float((grpo_advantages(self.rewards, EPS) ** 2).sum())


@dataclass
class GateRow:
    gate: str
    k: int
    tau: float
    n_groups: int
    n_zero_var: int
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float
    recall: float
    # of the all-fail and all-succeed groups still running after K: a gate cannot cut the others
    recall_all_fail: float
    recall_all_succeed: float
    auroc: float
    spearman: float
    tokens_saved_frac: float
    oracle_saved_frac: float
    frac_of_oracle: float
    adv_l2_preserved: float


def labelled_groups(groups: Sequence[GroupRecord]) -> list[LabelledGroup]:
    out = []
    for g in groups:
        if not g.has_final_rewards or g.g < 2:
            continue
        out.append(
            LabelledGroup(
                actions=[t.actions for t in g.trajectories],
                ended=[True] * g.g,  # logged trajectories are whole: shorter than K means ended
                step_tokens=[t.step_tokens for t in g.trajectories],
                rewards=[float(t.reward) for t in g.trajectories],  # type: ignore[arg-type]
            )
        )
    return out


def ranking_quality(scores: Sequence[float], informative: Sequence[bool]) -> tuple[float, float]:
    """AUROC and Spearman rho of a divergence score as a predictor of non-zero variance."""
    pos = [s for s, y in zip(scores, informative, strict=True) if y]
    neg = [s for s, y in zip(scores, informative, strict=True) if not y]
    if not pos or not neg:
        return math.nan, math.nan
    u = mannwhitneyu(pos, neg, alternative="two-sided").statistic
    auroc = float(u) / (len(pos) * len(neg))
    rho = spearmanr(scores, [float(y) for y in informative]).statistic
    return auroc, float(rho)


def _savings(groups: Sequence[LabelledGroup], stops: Sequence[bool], k: int) -> float:
    total = sum(g.total_tokens for g in groups)
    saved = sum(g.tokens_after(k) for g, s in zip(groups, stops, strict=True) if s)
    return saved / total if total else 0.0


def evaluate_gate(gate: Gate, label: str, tau: float, groups: Sequence[LabelledGroup]) -> GateRow:
    """Apply one gate at its K to every group and score its decisions against the outcomes."""
    k = gate.k
    stops = [
        g.live_after(k)
        and gate.decide(GroupView(g.actions, step=k, ended=g.ended, final_rewards=g.rewards)).stop
        for g in groups
    ]
    zero = [g.zero_variance for g in groups]
    tp = sum(s and z for s, z in zip(stops, zero, strict=True))
    fp = sum(s and not z for s, z in zip(stops, zero, strict=True))
    fn = sum(z and not s for s, z in zip(stops, zero, strict=True))
    tn = len(groups) - tp - fp - fn

    def class_recall(succeeded: bool) -> float:
        caught = [
            s
            for g, s, z in zip(groups, stops, zero, strict=True)
            if z and g.succeeded == succeeded and g.live_after(k)
        ]
        return sum(caught) / len(caught) if caught else math.nan

    scores = [prefix_edit_distance(g.actions, k, g.ended) for g in groups]
    auroc, rho = ranking_quality(scores, [not z for z in zero])
    saved = _savings(groups, stops, k)
    oracle = _savings(groups, zero, k)
    adv_total = sum(g.advantage_sq() for g in groups)
    adv_kept = sum(g.advantage_sq() for g, s in zip(groups, stops, strict=True) if not s)
    return GateRow(
        gate=label,
        k=k,
        tau=tau,
        n_groups=len(groups),
        n_zero_var=sum(zero),
        tp=tp,
        fp=fp,
        fn=fn,
        tn=tn,
        precision=tp / (tp + fp) if tp + fp else math.nan,
        recall=tp / (tp + fn) if tp + fn else math.nan,
        recall_all_fail=class_recall(False),
        recall_all_succeed=class_recall(True),
        auroc=auroc,
        spearman=rho,
        tokens_saved_frac=saved,
        oracle_saved_frac=oracle,
        frac_of_oracle=saved / oracle if oracle else math.nan,
        adv_l2_preserved=math.sqrt(adv_kept / adv_total) if adv_total else 1.0,
    )


def _fixed_params(gates: Sequence[str], params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per requested gate, the fixed values among ``params`` that it owns; a value no requested
    gate owns, or one that a gate sweeps, is a mistake worth one clear error."""
    own = {name: gate_class(name).own_params() for name in gates}
    for key in params:
        if not any(key in names for names in own.values()):
            raise ValueError(f"--param {key}: no requested gate ({', '.join(gates)}) has that parameter")
        swept = [name for name in gates if gate_class(name).threshold == key]
        if swept:
            raise ValueError(f"--param {key}: {swept[0]} sweeps it (--tau)")
    return {name: {key: v for key, v in params.items() if key in own[name]} for name in gates}


def sweep(
    groups: Sequence[LabelledGroup],
    ks: Sequence[int],
    taus: Sequence[float],
    gates: Sequence[str] = ("prefix_edit", "two_axis"),
    params: Mapping[str, Any] | None = None,
) -> list[GateRow]:
    """Every requested gate at each K over the grid of its threshold (once if it has none), with
    its other parameters from ``params`` or its defaults, plus the oracle at each K."""
    fixed = _fixed_params(gates, params or {})
    rows = []
    for k in ks:
        rows.append(evaluate_gate(build_gate("oracle", k=k), "oracle", math.nan, groups))
        for name in gates:
            threshold = gate_class(name).threshold
            for tau in [math.nan] if threshold is None else taus:
                swept = {} if threshold is None else {threshold: tau}
                rows.append(evaluate_gate(build_gate(name, k=k, **fixed[name], **swept), name, tau, groups))
    return rows


def write_csv(rows: Sequence[GateRow], path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(GateRow.__dataclass_fields__))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(row).items()})


def plot_pareto(rows: Sequence[GateRow], path: Path) -> None:
    """Savings vs precision, one line per gate and K (points along tau), oracle as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    keys = sorted({(r.gate, r.k) for r in rows if r.gate != "oracle"})
    for gate, k in keys:
        pts = [(r.tokens_saved_frac, r.precision) for r in rows if r.gate == gate and r.k == k]
        pts = [(x, y) for x, y in pts if not math.isnan(y)]
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(np.array(xs) * 100, ys, marker="o", ms=3, label=f"{gate} K={k}")
    for r in rows:
        if r.gate == "oracle":
            ax.scatter([r.tokens_saved_frac * 100], [1.0], marker="*", s=150, zorder=5)
            ax.annotate(
                f"oracle K={r.k}",
                (r.tokens_saved_frac * 100, 1.0),
                fontsize=8,
                xytext=(4, -10),
                textcoords="offset points",
            )
    ax.axhline(0.9, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("rollout step-tokens saved (%)")
    ax.set_ylabel("precision (cut groups that were truly zero-variance)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Gate Pareto front: savings vs precision")
    if ax.get_legend_handles_labels()[0]:  # nothing fired at any threshold: no curve to label
        ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k must be comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--k values must be >= 1, got {text!r}")
    return ks


def parse_taus(text: str) -> list[float]:
    """``a:b:step`` (inclusive) or a comma list."""
    try:
        if ":" in text:
            lo, hi, step = (float(x) for x in text.split(":"))
            if step <= 0:
                raise ValueError
            taus = [round(x, 6) for x in np.arange(lo, hi + step / 2, step)]
        else:
            taus = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tau must be lo:hi:step or a comma list, got {text!r}") from None
    if not taus or min(taus) < 0 or max(taus) > 1:
        raise argparse.ArgumentTypeError(f"--tau values must lie in [0, 1], got {text!r}")
    return taus


def parse_param(text: str) -> tuple[str, str]:
    """``name=value``: a fixed gate parameter (the gate's model converts the value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--param must be name=value, got {text!r}")
    return key.strip(), value.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.analysis.gate_eval.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rollouts", required=True, type=Path, help="rollouts.jsonl (one group per line)")
    parser.add_argument("--out", required=True, type=Path, help="output folder for gate_eval.csv/.png")
    parser.add_argument("--k", type=parse_ks, default=[5, 10, 15])
    parser.add_argument("--tau", type=parse_taus, default=parse_taus("0.02:0.30:0.02"))
    parser.add_argument("--gates", default="prefix_edit,two_axis")
    parser.add_argument("--t-high", type=float, help="two_axis termination threshold (its default: 0.9)")
    parser.add_argument(
        "--param",
        type=parse_param,
        action="append",
        default=[],
        help="name=value: a fixed parameter of the requested gates (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        groups = labelled_groups(list(read_groups(args.rollouts)))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not groups:
        print(f"error: {args.rollouts} holds no group with known final rewards to evaluate", file=sys.stderr)
        return 2
    try:
        params = dict(args.param) | ({} if args.t_high is None else {"t_high": args.t_high})
        rows = sweep(groups, args.k, args.tau, [g for g in args.gates.split(",") if g], params)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "gate_eval.csv")
    plot_pareto(rows, args.out / "gate_pareto.png")
    n_zero = sum(g.zero_variance for g in groups)
    print(
        f"{len(groups)} groups ({n_zero} zero-variance); wrote {args.out / 'gate_eval.csv'} "
        f"and {args.out / 'gate_pareto.png'}"
    )
    for k in args.k:
        best = max(
            (r for r in rows if r.k == k and r.gate == "prefix_edit" and r.precision >= 0.9),
            key=lambda r: r.tokens_saved_frac,
            default=None,
        )
        if best is not None:
            print(
                f"K={k}: best prefix_edit at precision>=0.9: tau={best.tau} saves "
                f"{best.tokens_saved_frac:.1%} ({best.frac_of_oracle:.0%} of oracle); recall of "
                f"all-fail {best.recall_all_fail:.2f}, all-succeed {best.recall_all_succeed:.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
