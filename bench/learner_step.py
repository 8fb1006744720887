"""Learner throughput on SmolLM2-135M: ZeRO-0 x1 vs ZeRO-2 x2, LoRA vs full, fp32 vs bf16-mixed
(autocast), packed vs per-step forwards, the vocabulary projection at the policy tokens only vs at
every position, weight-sync seconds per method (gloo process group vs Ray object store), and, with
``--only allocator``, the learner on glibc's malloc vs jemalloc (``placement.learner_allocator``).

Each learner configuration runs one warm-up step and then ``--steps`` measured steps on the same
synthetic multi-turn batch (random token ids shaped like ALFWorld dialogues; the allocator arms on
batches of 1-4 extra turns, a new length every step). Prints one JSON object; ``--out`` also
writes it. A section that fails is reported in it and the script exits 1 once every other section
has run.

    python bench/learner_step.py [--only zero precision lora packing projection sync allocator] [--tiny]

``--tiny`` (what CI runs) plays one group of two one-turn trajectories in the sections with code of
their own: zero, packing, projection and sync (precision and lora time zero's learner in another
config).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import ray
import torch
from _tiny import parse_args
from transformers import AutoModelForCausalLM

from selective_rollout.config import load_config
from selective_rollout.config.engine import EngineConfig
from selective_rollout.config.placement import PlacementConfig
from selective_rollout.config.trainer import LoraConfig, TrainerConfig
from selective_rollout.learner import LearnerGroup
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.losses import batch_denominator
from selective_rollout.learner.modeling import token_logprobs
from selective_rollout.learner.objective import micro_batch_loss
from selective_rollout.learner.packing import collate, per_step_segments
from selective_rollout.models import resolve_model
from selective_rollout.precision import learner_precision
from selective_rollout.records import Experience
from selective_rollout.rollout.engines.transformers_engine import TransformersEngine

PROFILE = Path(__file__).resolve().parents[1] / "configs" / "cpu_default.yaml"


def synthetic_batch(groups: int, g: int, turns: int, vocab: int, seed: int = 0) -> list[Experience]:
    """System prompt ~60 tokens, then per turn an observation ~25 tokens and a reply ~15 tokens."""
    rng = random.Random(seed)
    batch = []
    for gi in range(groups):
        for j in range(g):
            ids, mask = [rng.randrange(vocab) for _ in range(60)], [0] * 60
            for _ in range(turns):
                n_obs, n_reply = rng.randint(20, 30), rng.randint(10, 20)
                ids += [rng.randrange(vocab) for _ in range(n_obs + n_reply)]
                mask += [0] * n_obs + [1] * n_reply
            old = [-2.0 if m else 0.0 for m in mask]
            batch.append(Experience(f"g{gi}", f"t{gi}", "pick", ids, mask, old, float(j % 2)))
    return batch


def learner_tokens_per_s(
    cfg: TrainerConfig,
    model: Path,
    batches: list[list[Experience]],
    steps: int,
    cpus: int,
    options: dict | None = None,
) -> dict:
    """A warm-up step on ``batches[0]``, then ``steps`` measured steps cycling through ``batches``;
    ``resident_gb`` is the learner process's resident memory after the last step."""
    group = LearnerGroup(cfg, model, actor_options={"num_cpus": cpus, **(options or {})})
    try:
        group.train_step(batches[0])
        runs = [group.train_step(batches[(i + 1) % len(batches)]) for i in range(steps)]
        return {
            "tokens_per_s": statistics.median(r["train/tokens_per_s"] for r in runs),
            "step_s": statistics.median(r["train/step_s"] for r in runs),
            "resident_gb": max(group.resident_gb()),
        }
    finally:
        group.shutdown()


def allocator_arms(
    cfg: TrainerConfig, model: Path, batches: list[list[Experience]], steps: int, cpus: int
) -> dict:
    """The learner on glibc's malloc and on jemalloc (``placement.learner_allocator``), each in a fresh
    process, on batches of every length as in a run (a fixed batch would let glibc reuse its
    freed blocks exactly and hide what it keeps)."""
    out = {}
    for allocator in ("system", "jemalloc"):
        options = PlacementConfig().process_options(allocator, local=True)  # this bench starts its own Ray
        out[allocator] = learner_tokens_per_s(cfg, model, batches, steps, cpus, options)
        print(json.dumps({f"allocator_{allocator}": out[allocator]}), flush=True)
    system, jemalloc = out["system"], out["jemalloc"]
    out["jemalloc_over_system"] = {
        "tokens_per_s": jemalloc["tokens_per_s"] / system["tokens_per_s"],
        "resident_gb": jemalloc["resident_gb"] / system["resident_gb"],
    }
    return out


def packed_vs_per_step(model_path: Path, batch: list[Experience], threads: int) -> dict:
    """Forward+backward of the same loss, one sequence per trajectory vs one per reply (the paper's)."""
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    cfg = TrainerConfig()
    adv = compute_advantages(batch, cfg.advantage)
    denom = batch_denominator(cfg.loss_agg, [e.num_policy_tokens for e in batch])
    steps, step_adv = [], []
    for e, a in zip(batch, adv, strict=True):
        segs = per_step_segments(e)
        steps += segs
        step_adv += [a] * len(segs)

    def run(exps: list[Experience], advs: list[float]) -> tuple[float, float, int]:
        model.zero_grad()
        start = time.perf_counter()
        total = 0.0
        for e, a in zip(exps, advs, strict=True):  # one sequence per forward: no padding in either arm
            loss, _ = micro_batch_loss(model, collate([e], [a]), cfg, denom)
            loss.backward()
            total += loss.item()
        return time.perf_counter() - start, total, sum(len(e.token_ids) for e in exps)

    packed_s, packed_loss, packed_tokens = run(batch, adv)
    step_s, step_loss, step_tokens = run(steps, step_adv)
    return {
        "packed_s": packed_s,
        "per_step_s": step_s,
        "speedup": step_s / packed_s,
        "packed_tokens": packed_tokens,
        "per_step_tokens": step_tokens,
        "loss_abs_diff": abs(packed_loss - step_loss),
    }


def projection_at_policy_tokens(model_path: Path, batch: list[Experience], threads: int, steps: int) -> dict:
    """Forward+backward (in the profile learner's precision on this CPU) of the same masked
    log-likelihood, the vocabulary projection at every position (the unrestricted path) vs only at
    the policy tokens (``token_logprobs(positions=...)``, what the learner runs), arms alternating."""
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    mb = collate(batch, [1.0] * len(batch))
    precision = learner_precision(load_config(PROFILE).trainer.precision, "cpu")

    def run(restricted: bool) -> float:
        model.zero_grad()
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            positions = mb.loss_mask > 0 if restricted else None
            logp = token_logprobs(model, mb.input_ids, mb.attention_mask, True, positions=positions).logprobs
        (-(logp * mb.loss_mask).sum()).backward()
        return time.perf_counter() - start

    run(True), run(False)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps):
        for restricted in (False, True):
            times[restricted].append(run(restricted))
    every, policy = statistics.median(times[False]), statistics.median(times[True])
    return {
        "every_position_s": every,
        "policy_tokens_s": policy,
        "speedup": every / policy,
        "policy_token_frac": float(mb.loss_mask.sum() / mb.attention_mask.sum()),
        "tokens": int(mb.attention_mask.sum()),
        "precision": precision,
    }


def sync_seconds(model: Path, method: str, engines: int, repeats: int) -> dict:
    group = LearnerGroup(TrainerConfig(weight_sync=method), model, actor_options={"num_cpus": 1})
    actors = [
        ray.remote(TransformersEngine).options(num_cpus=1).remote(EngineConfig(threads=1), model)
        for _ in range(engines)
    ]
    try:
        first = group.sync_weights(actors, 0)  # includes building the process group
        times = [group.sync_weights(actors, 0) for _ in range(repeats)]
        expected = group.weights_checksum()
        ok = all(abs(ray.get(a.weights_checksum.remote()) - expected) <= 1e-6 * abs(expected) for a in actors)
        return {"first_s": first, "warm_s": statistics.median(times), "checksum_ok": ok}
    finally:
        group.shutdown()
        for a in actors:
            ray.kill(a)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=2, help="CPU threads of the single-learner runs")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--micro-batch-tokens", type=int, default=512)
    parser.add_argument(
        "--only",
        nargs="*",
        default=["zero", "precision", "lora", "packing", "projection", "sync"],
        help="sections to run; `allocator` (not run by default) compares glibc with jemalloc",
    )
    parser.add_argument("--out", type=Path)
    args = parse_args(parser, groups=1, group_size=2, turns=1, only=["zero", "packing", "projection", "sync"])

    model = resolve_model(args.model)
    vocab = AutoModelForCausalLM.from_pretrained(model).config.vocab_size
    batch = synthetic_batch(args.groups, args.group_size, args.turns, vocab)
    result: dict = {"model": args.model, "batch_tokens": sum(len(e.token_ids) for e in batch)}
    ray.init(address="local", num_cpus=8, include_dashboard=False, _node_ip_address="127.0.0.1")

    def section(name: str, fn, *fn_args) -> None:  # one failed section (e.g. OOM) still reports the rest
        try:
            result[name] = fn(*fn_args)
        except (ray.exceptions.RayError, RuntimeError) as exc:
            result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        print(json.dumps({name: result[name]}), flush=True)

    try:
        full = TrainerConfig(micro_batch_tokens=args.micro_batch_tokens)
        if "zero" in args.only:
            section("zero0_x1", learner_tokens_per_s, full, model, [batch], args.steps, args.cpus)
            zero2 = full.model_copy(update={"zero_stage": 2, "num_learners": 2})
            section(
                "zero2_x2", learner_tokens_per_s, zero2, model, [batch], args.steps, max(1, args.cpus // 2)
            )
        if "precision" in args.only:  # the same learner, fp32 then bf16-mixed, back to back
            section("fp32_x1", learner_tokens_per_s, full, model, [batch], args.steps, args.cpus)
            mixed = full.model_copy(update={"precision": "bf16-mixed"})
            section("bf16_mixed_x1", learner_tokens_per_s, mixed, model, [batch], args.steps, args.cpus)
            if "tokens_per_s" in result["fp32_x1"] and "tokens_per_s" in result["bf16_mixed_x1"]:
                ratio = result["bf16_mixed_x1"]["tokens_per_s"] / result["fp32_x1"]["tokens_per_s"]
                result["bf16_mixed_over_fp32"] = ratio
                print(json.dumps({"bf16_mixed_over_fp32": ratio}), flush=True)
        if "lora" in args.only:
            lora = full.model_copy(update={"lora": LoraConfig(enabled=True, rank=16)})
            section("lora_zero0_x1", learner_tokens_per_s, lora, model, [batch], args.steps, args.cpus)
        if "packing" in args.only:
            section("packed_vs_per_step", packed_vs_per_step, model, batch, args.cpus)
        if "projection" in args.only:
            section("projection", projection_at_policy_tokens, model, batch, args.cpus, max(3, args.steps))
        if "allocator" in args.only:  # the profile's learner (its precision) on batches of every length
            profile = load_config(PROFILE).trainer.model_copy(
                update={"micro_batch_tokens": args.micro_batch_tokens}
            )
            varied = [
                synthetic_batch(args.groups, args.group_size, args.turns + i % 4, vocab, seed=i)
                for i in range(args.steps + 1)
            ]
            section("allocator", allocator_arms, profile, model, varied, args.steps, args.cpus)
        if "sync" in args.only:
            for method in ("gloo", "object_store"):
                section(f"sync_{method}", sync_seconds, model, method, args.engines, 3)
    finally:
        ray.shutdown()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if any("error" in v for v in result.values() if isinstance(v, dict)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
