"""Fit the ``learned`` gate's model (``gate.learned.fit_model``) from logged rollouts: the CLI.

    python -m selective_rollout.analysis.gate_eval.fit --rollouts A.jsonl [B.jsonl ...] --k 4 [--steps 6,8]
        [--target 0.9] [--l2 1.0] [--cv-folds 5] --out gate.json

One row per labelled group (final rewards known) and decision step at which a run would ask
(K, then ``--steps``, while a trajectory is still running): the divergence features there and
the step, labelled by whether the group ended zero-variance. An L2-regularised logistic
regression on standardised features (numpy + scipy) gives P(zero variance). The stopping
threshold is chosen for ``--target`` precision of the gate as it runs (a group stops at the
first step where P >= threshold): the lowest threshold whose precision on the fit data reaches
the target. To keep that choice honest the probabilities it is chosen on are out-of-fold (each
task's groups scored by a model fit without that task, ``--cv-folds``), then the model is refit
on everything. When no threshold reaches the target the file says so and its gate never stops.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from selective_rollout.gate.learned import fit_model
from selective_rollout.records import read_groups


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selective_rollout.analysis.gate_eval.fit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rollouts", required=True, nargs="+", type=Path, help="rollouts.jsonl files")
    parser.add_argument("--out", required=True, type=Path, help="the model file to write (JSON)")
    parser.add_argument("--k", type=int, default=10, help="the gate's K (gate.k of the runs that use it)")
    parser.add_argument("--steps", type=_ints, default=[], help="later decision steps, e.g. 6,8 (gate.steps)")
    parser.add_argument("--target", type=float, default=0.9, help="precision the threshold is chosen for")
    parser.add_argument("--l2", type=float, default=1.0, help="L2 penalty on the standardised weights")
    parser.add_argument(
        "--cv-folds", type=int, default=5, help="folds (by task) for the threshold; <2: in-sample"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.k < 1 or any(s <= args.k for s in args.steps) or not 0 < args.target <= 1 or args.l2 < 0:
        print("error: need --k >= 1, --steps > k, 0 < --target <= 1 and --l2 >= 0", file=sys.stderr)
        return 2
    try:
        groups = [g for path in args.rollouts for g in read_groups(path)]
        model = fit_model(
            groups,
            args.k,
            args.steps,
            args.target,
            args.l2,
            args.cv_folds,
            args.seed,
            [str(p) for p in args.rollouts],
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    info = model.info
    where = f"k={model.k}" + (f" steps={model.steps}" if model.steps else "")
    print(
        f"fit on {info['groups']} groups ({info['zero_variance']} zero-variance), {info['rows']} rows,", where
    )
    for name, weight in sorted(zip(model.features, model.weights, strict=True), key=lambda t: -abs(t[1])):
        print(f"  {name:<26} {weight:+.3f}")
    if info["reached_target"]:
        print(
            f"threshold P >= {model.threshold:.3f} for precision {args.target} ({info['threshold_on']}): "
            f"precision {info['fit_precision']:.2f}, recall {info['fit_recall']:.2f}, "
            f"saves {info['fit_saved']:.1%}"
        )
    else:
        print(f"no threshold reached precision {args.target} on the fit data: this gate never stops")
    keys = f"gate.k={model.k}" + (f" gate.steps=[{','.join(map(str, model.steps))}]" if model.steps else "")
    print(f"wrote {args.out}; use it with gate.name=learned gate.model_path={args.out} {keys}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
