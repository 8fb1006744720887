"""Is the CPU profile in the method's regime, and what does a step cost?

Runs ``--tasks`` ungated groups of the configured profile (strategy none, no refill, no audit:
what the ungated arm of an experiment sees), then prints the regime figures the targets name
(zero-variance share with its all-fail and all-succeed parts, G, max_steps, median trajectory
length, K and how many distinct values D_K takes) and the cost of a step (env steps/s,
generated tokens/s, the whole prompt per step and the part the engine actually prefilled).
Pass overrides to measure another profile side by side, e.g. the previous default:

    python bench/regime.py --tasks 24 [--config configs/cpu_default.yaml] [overrides ...]
    python bench/regime.py --tasks 12 rollout.group_size=4 logging.regime_k=2 \\
        agent.admissible_in_prompt=every_turn

``--out DIR`` keeps the rollouts (``DIR/rollouts.jsonl``) for the offline gate sweep
(``python -m selective_rollout.analysis.gate_eval.evaluate``). ``--rollouts FILE [FILE ...]`` runs nothing and
prints the regime of logged groups instead (e.g. an experiment's ungated arms, pooled), and for a
gated log what its audits cost as a share of its step-tokens. ``--tiny`` (what CI runs) plays
one group of the tiny run (``TINY_RUN``) under the overrides given.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from _tiny import parse_args

from selective_rollout.analysis.report import regime_summary, rollout_summary
from selective_rollout.config import load_config
from selective_rollout.records import GroupRecord, Outcome, read_groups


def print_audit_spending(groups: list[GroupRecord]) -> None:
    """What the audits of a gated log cost: their step-tokens after the gate step, as a share of
    all the log's step-tokens (``rollout.audit_budget`` is the cap this is held to)."""
    audited = [g for g in groups if g.outcome is Outcome.AUDITED and g.gate is not None]
    if not audited:
        return
    cost = sum(g.tokens_after(g.gate.step) for g in audited)
    right = sum(bool(g.zero_variance) for g in audited)
    total = sum(g.step_tokens for g in groups)
    print(
        f"audits: {len(audited)} audited groups ({right} zero-variance) took {cost / total:.1%} of the "
        f"{total:,} step-tokens"
    )


def print_regime(groups: list[GroupRecord], k: int) -> None:
    summary, regime = rollout_summary(groups), regime_summary(groups, k)
    print_audit_spending(groups)
    if not regime["groups"]:
        print("no group ran to the end: nothing to measure")
        return
    sizes = sorted({g.g for g in groups if g.trajectories})
    print(
        f"regime over {regime['groups']} groups (G = {', '.join(map(str, sizes))}): zero-variance "
        f"{summary['zero_var_frac']:.1%} (all-fail {regime['all_fail_frac']:.1%}, all-succeed "
        f"{regime['all_succeed_frac']:.1%}); median trajectory {regime['median_trajectory_steps']:.0f} "
        f"steps; D_{regime['k']} takes {regime['d_k_distinct']} distinct values"
    )
    by_type: dict[str, list[bool]] = defaultdict(list)
    for g in groups:
        by_type[g.task_type] += [t.won for t in g.trajectories if t.reward is not None]
    rates = ", ".join(f"{k} {sum(v) / len(v):.0%}" for k, v in sorted(by_type.items()) if v)
    print(f"success by task type: {rates}")
    by_preset: dict[str, list[GroupRecord]] = defaultdict(list)
    for g in groups:
        match = re.search(r"trial_([a-z]+)_s\d+_", g.task_id)
        by_preset[match.group(1) if match else "other"].append(g)
    if len(by_preset) > 1:  # a mixed game set: does one preset hold the zero-variance groups?
        for preset, part in sorted(by_preset.items()):
            r = regime_summary(part, k)
            print(
                f"  {preset}: {r['groups']} groups, all-fail {r['all_fail_frac']:.1%}, all-succeed "
                f"{r['all_succeed_frac']:.1%}, median {r['median_trajectory_steps']:.0f} steps"
            )


def run(args: argparse.Namespace) -> None:
    import ray
    from rollout_ab import run_arm

    from selective_rollout.models import resolve_model
    from selective_rollout.rollout.engines import create_engines
    from selective_rollout.runtime import init_ray, task_stream, train_tasks
    from selective_rollout.sft import warm_start_model

    n = args.tasks
    fixed = [
        "rollout.strategy=none",
        "rollout.refill=false",
        "rollout.audit_budget=0",
        f"rollout.groups_per_iteration={n}",
    ]
    cfg = load_config(args.config, [*args.overrides, *fixed])
    init_ray(None)
    model = resolve_model(cfg.engine.model, cfg.engine.model_cache_dir)
    if cfg.warm_start.enabled:
        model = warm_start_model(cfg, model)
    engines = create_engines(cfg.engine, model, cfg.engine.num_engines)
    tasks = list(itertools.islice(task_stream(train_tasks(cfg), cfg.seed), n))
    out = args.out or Path(tempfile.mkdtemp(prefix="regime-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollouts.jsonl").unlink(missing_ok=True)
    rc = cfg.rollout
    print(
        f"model {Path(model).name}, env {cfg.env.name} {cfg.env.model_extra or {}}, G={rc.group_size}, "
        f"max_steps={rc.max_steps}, "
        f"K={cfg.regime_k}, temperature {cfg.engine.temperature}, engine {cfg.engine.dtype}, admissible "
        f"listed {cfg.agent.admissible_in_prompt}, history {cfg.agent.history_turns} turns, {n} tasks"
    )
    before = ray.get(engines[0].health.remote())
    arm = run_arm(cfg, engines, model, tasks, "ungated", out)
    after = ray.get(engines[0].health.remote())
    ray.get([e.shutdown.remote() for e in engines])

    groups = list(read_groups(out / "rollouts.jsonl"))
    print()
    print_regime(groups, cfg.regime_k)
    steps = [s for g in groups for t in g.trajectories for s in t.steps]
    requests = after.get("requests", 0) - before.get("requests", 0)
    prefilled = after.get("prefilled_tokens", 0) - before.get("prefilled_tokens", 0)
    m = arm["metrics"]
    print(
        f"cost: {m['system/env_steps_per_s']:.2f} env steps/s, "
        f"{m['system/tokens_per_s']:.1f} generated tokens/s, "
        f"prompt {statistics.mean(s.prompt_tokens for s in steps):.0f} tokens/step "
        f"({prefilled / max(requests, 1):.0f} prefilled per engine request), "
        f"{rollout_summary(groups)['step_tokens_spent'] / max(len(steps), 1):.0f} step-tokens/step"
    )
    print(f"rollouts: {out / 'rollouts.jsonl'}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/cpu_default.yaml")
    parser.add_argument("--tasks", type=int, default=24, help="groups to run (one per task)")
    parser.add_argument("--out", type=Path, default=None, help="keep rollouts.jsonl here")
    parser.add_argument("--rollouts", type=Path, nargs="+", help="analyse these logs instead of running")
    parser.add_argument("overrides", nargs="*")
    args = parse_args(parser, tasks=1)
    if args.rollouts:
        k = load_config(args.config, args.overrides).regime_k
        print_regime([g for path in args.rollouts for g in read_groups(path)], k)
    else:
        run(args)


if __name__ == "__main__":
    main()
