"""The paper's Tier-1 rollout experiment on the CPU profile, plus this system's own comparisons.

All arms run in one process over one Ray cluster, one engine (same weights) and the same task
stream, back to back, and the script prints ratios:

1. gate off vs on (paper protocol, no refill): wall-clock saved, step-tokens saved, groups cut,
   the cut groups' TP/FP judged by the ungated arm's outcome on the same task, and the ratio
   wall-saved / tokens-saved (target >= 0.9: the system turns saved work into time).
2. concurrent coordinator vs the paper's lock-step loop (gate off): env steps/s and tokens/s
   (target >= 3x), two rollout sources of one contract, ``GroupCoordinator`` and ``LockstepRollout``
   (``rollout.mode`` selects the class the coordinator actor runs). The lock-step arm is the paper's
   ``rollout_group`` loop: one group at a time; each turn every live trajectory of the group
   sends its request at once (one engine round, batched by the engine's decode batching) and then
   all take one environment step together; each trajectory keeps its KV session across turns,
   which is what the paper's vLLM server with ``enable_prefix_caching=True`` gives (its dialogue
   prefix is not prefilled again), and the turn's requests are prefilled together in one padded
   forward, as vLLM batches them. Where it cannot match: the paper's process steps its
   environments in a loop where ours are Ray workers.
3. refill on, dapo vs selective+dapo: wall-clock per informative (non-zero-variance) group
   delivered (target >= 30% less).
4. jump-forward decoding (gate off): the profile's engine against a second one that feeds one
   token per forward (``engine.decode_chunk_tokens=1``), arms alternating over ``--rounds``, the
   same tasks. Given the same seed and batch the two decode the same tokens (the tests check it);
   in a rollout the arms' batches differ, so their trajectories differ a little (compare their
   step-tokens). Printed: env steps/s and the engine's decode forwards per env step.

    python bench/rollout_ab.py [--tasks 8] [--config configs/cpu_default.yaml] [--tiny] [overrides ...]

``--tiny`` (what CI runs) plays one task per arm on the tiny run (``TINY_RUN``) under the overrides
given.

Each arm also prints where its time went: env steps/s, generated tokens/s, prompt tokens prefilled
per env step, the engine busy fraction (share of the arm's wall-clock with at least one request in
the engine, ``busy_s`` of ``health()``) and the env busy fraction (the workers' step and reset time
over wall-clock x workers). On 2 CPU cores the engine (SmolLM2, constrained choice) dominates step
time; see those figures before reading the ratios.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

from _tiny import parse_args

from selective_rollout.config import load_config
from selective_rollout.records import Outcome


def run_arm(cfg, engines, model_path, tasks, label: str, run_dir: Path | None = None) -> dict[str, Any]:
    """One coordinator over ``tasks``, timed from its first rollout call to its batch
    (``run_dir``: where its rollouts.jsonl goes; none by default)."""
    import ray

    from selective_rollout.rollout.coordinator import create_coordinator

    coordinator = create_coordinator(cfg, engines, model_path, run_dir)
    try:
        env0 = ray.get(coordinator.env_metrics.remote())  # env workers up before the clock starts
        # every arm starts from a cold cache: the same tasks' prompts, cached by an earlier arm
        # (vLLM's prefix cache outlives a group's sessions), would otherwise favour the later arm
        ray.get([e.reset_cache.remote() for e in engines])
        engine0 = ray.get([e.health.remote() for e in engines])
        start = time.perf_counter()
        batch = ray.get(coordinator.rollout.remote(tasks, 0))
        wall = time.perf_counter() - start
        env1 = ray.get(coordinator.env_metrics.remote())
        engine1 = ray.get([e.health.remote() for e in engines])
    finally:
        # bounded: after Ctrl-C the rollout call may still hold the actor; kill it regardless
        try:
            ray.get(coordinator.shutdown.remote(), timeout=30)
        except ray.exceptions.GetTimeoutError:
            print("  the coordinator did not shut down within 30 s; killing it", file=sys.stderr)
        ray.kill(coordinator)
    m = dict(batch.metrics)
    informative = sum(1 for g in batch.groups if g.outcome is Outcome.COMPLETED and g.zero_variance is False)
    steps = max(env1["env/steps"] - env0["env/steps"], 1.0)
    delta = [
        {k: b[k] - a.get(k, 0) for k in ("busy_s", "prefilled_tokens")}
        for a, b in zip(engine0, engine1, strict=True)
    ]
    m["bench/engine_busy_frac"] = sum(d["busy_s"] for d in delta) / (wall * len(engines))
    m["bench/env_busy_frac"] = (env1["env/busy_s"] - env0["env/busy_s"]) / (
        wall * max(env1["env/workers"], 1.0)
    )
    m["bench/prefilled_per_env_step"] = sum(d["prefilled_tokens"] for d in delta) / steps
    print(
        f"  {label:<28} wall {wall:7.1f} s  step-tokens {m['rollout/step_tokens']:>9,.0f}  "
        f"cut {int(m['rollout/groups_cut'])}  kept {int(m['rollout/groups_completed'])}  "
        f"filtered {int(m['rollout/groups_filtered'])}  informative {informative}\n"
        f"  {'':<28} env steps/s {m['system/env_steps_per_s']:.2f}  generated tokens/s "
        f"{m['system/tokens_per_s']:.1f}  prompt tokens prefilled per env step "
        f"{m['bench/prefilled_per_env_step']:.1f}  engine busy {m['bench/engine_busy_frac']:.0%}  "
        f"env busy {m['bench/env_busy_frac']:.0%}"
    )
    return {"batch": batch, "wall": wall, "informative": informative, "metrics": m}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/cpu_default.yaml")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: gate,lockstep,dapo,jump")
    parser.add_argument("--rounds", type=int, default=1, help="alternations of the two arms of part 4")
    parser.add_argument("overrides", nargs="*")
    args = parse_args(parser, tasks=1)
    skip = set(filter(None, args.skip.split(",")))

    import ray

    from selective_rollout.models import resolve_model
    from selective_rollout.rollout.engines import create_engines
    from selective_rollout.runtime import init_ray, task_stream, train_tasks
    from selective_rollout.sft import warm_start_model

    base = load_config(args.config, ["rollout.audit_budget=0", *args.overrides])
    init_ray(None)
    model = resolve_model(base.engine.model, base.engine.model_cache_dir)
    if base.warm_start.enabled:
        model = warm_start_model(base, model)
    engines = create_engines(base.engine, model, base.engine.num_engines)
    tasks = list(itertools.islice(task_stream(train_tasks(base), base.seed), args.tasks * 4))
    n = args.tasks
    print(
        f"model {Path(model).name}, G={base.rollout.group_size}, gate {base.gate.name} K={base.gate.k} "
        f"{base.gate.model_extra or {}}, "
        f"{n} tasks, max_steps={base.rollout.max_steps}"
    )

    def cfg(*extra: str):
        return load_config(args.config, ["rollout.audit_budget=0", *args.overrides, *extra])

    if "gate" not in skip:
        print("\n[1] gate off vs on, paper protocol (no refill), same tasks")
        common = ["rollout.refill=false", f"rollout.groups_per_iteration={n}"]
        off = run_arm(cfg("rollout.strategy=none", *common), engines, model, tasks[:n], "gate off (none)")
        on = run_arm(
            cfg("rollout.strategy=selective", *common), engines, model, tasks[:n], "gate on (selective)"
        )
        truth = {g.task_id: g.zero_variance for g in off["batch"].groups}
        cut = [g for g in on["batch"].groups if g.outcome is Outcome.CUT]
        tp = sum(1 for g in cut if truth.get(g.task_id))
        tokens_saved = 1 - on["metrics"]["rollout/step_tokens"] / off["metrics"]["rollout/step_tokens"]
        wall_saved = 1 - on["wall"] / off["wall"]
        print(
            f"  wall-clock saved {wall_saved:.1%}, step-tokens saved {tokens_saved:.1%}, "
            f"groups cut {len(cut)} (TP {tp}, FP {len(cut) - tp}, judged by the ungated arm's outcome "
            "on the same task)"
        )
        if tokens_saved > 0:
            print(f"  wall-saved / tokens-saved = {wall_saved / tokens_saved:.2f}  (target >= 0.90)")
    if "lockstep" not in skip:
        from selective_rollout.rollout.source import ROLLOUT_MODES

        print("\n[2] concurrent coordinator vs the paper's lock-step loop (gate off, same tasks)")
        common = ["rollout.strategy=none", "rollout.refill=false", f"rollout.groups_per_iteration={n}"]
        lock, conc = (
            run_arm(
                cfg(*common, f"rollout.mode={mode}"),
                engines,
                model,
                tasks[:n],
                ROLLOUT_MODES.get(mode).__name__,
            )
            for mode in ("lockstep", "concurrent")
        )
        for key, name in (("system/env_steps_per_s", "env steps/s"), ("system/tokens_per_s", "tokens/s")):
            print(f"  {name}: x{conc['metrics'][key] / max(lock['metrics'][key], 1e-9):.2f}  (target >= 3x)")
        for key, name in (("bench/engine_busy_frac", "engine busy"), ("bench/env_busy_frac", "env busy")):
            print(f"  {name}: lock-step {lock['metrics'][key]:.0%}, concurrent {conc['metrics'][key]:.0%}")
        print("  engine busy target in the concurrent arm: >= 90%")
    if "dapo" not in skip:
        print("\n[3] refill on: wall per informative group delivered, dapo vs selective+dapo (same stream)")
        common = ["rollout.refill=true", f"rollout.groups_per_iteration={max(1, n // 2)}"]
        dapo = run_arm(cfg("rollout.strategy=dapo", *common), engines, model, tasks, "dapo")
        both = run_arm(
            cfg("rollout.strategy=selective+dapo", *common), engines, model, tasks, "selective+dapo"
        )
        if dapo["informative"] and both["informative"]:
            per_dapo, per_both = dapo["wall"] / dapo["informative"], both["wall"] / both["informative"]
            print(
                f"  wall per informative group: dapo {per_dapo:.1f} s, selective+dapo {per_both:.1f} s, "
                f"{1 - per_both / per_dapo:.1%} less  (target >= 30%)"
            )
        else:
            print(
                f"  not measurable on this stream: informative groups delivered: dapo {dapo['informative']}, "
                f"selective+dapo {both['informative']} (raise --tasks or use a policy with more mixed groups)"
            )
    if "jump" not in skip and base.engine.backend != "transformers":
        backend = base.engine.backend
        print(f"\n[4] jump-forward decoding: skipped (the {backend} engine has no decode_chunk_tokens)")
    elif "jump" not in skip:
        print("\n[4] jump-forward decoding: forced runs fed at once vs one token per forward (gate off)")
        common = ["rollout.strategy=none", "rollout.refill=false", f"rollout.groups_per_iteration={n}"]
        stepped_engines = create_engines(
            cfg("engine.decode_chunk_tokens=1").engine, model, base.engine.num_engines
        )
        arms = {"one token per forward": stepped_engines, "jump-forward (the profile's)": engines}
        steps: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, arm_engines in arms.items():
                before = ray.get(arm_engines[0].health.remote())
                res = run_arm(cfg(*common), arm_engines, model, tasks[:n], name)
                after = ray.get(arm_engines[0].health.remote())
                forwards = after["decode_forwards"] - before["decode_forwards"]
                generated = after["generated_tokens"] - before["generated_tokens"]
                forced = after["forced_tokens"] - before["forced_tokens"]
                env_steps = res["metrics"]["rollout/env_steps"]
                print(
                    f"  {name}: {forwards / max(env_steps, 1):.2f} decode forwards per env step, "
                    f"{generated / max(env_steps, 1):.1f} tokens per reply, "
                    f"{forced / max(generated, 1):.0%} forced"
                )
                steps[name].append(res["metrics"]["system/env_steps_per_s"])
        slow, fast = (sum(v) / len(v) for v in steps.values())
        print(f"  env steps/s: {slow:.2f} -> {fast:.2f}, x{fast / max(slow, 1e-9):.2f}")
        ray.get([e.shutdown.remote() for e in stepped_engines])
    ray.get([e.shutdown.remote() for e in engines])


if __name__ == "__main__":
    main()
