"""Synthetic logged groups for the gate tests: converged or divergent action prefixes, chosen rewards."""

from __future__ import annotations

import random

from selective_rollout.records import GroupRecord, Step, Trajectory

TOKENS = 100  # step-tokens per step (90 prompt + 10 completion)


def group(
    task: str,
    actions: list[list[str]],
    rewards: list[float],
    gid: str | None = None,
    iteration: int = 0,
    task_type: str = "pick",
) -> GroupRecord:
    trajectories = [
        Trajectory(i, [Step(a, True, 90, 10) for a in acts], reward=float(r), won=r > 0)
        for i, (acts, r) in enumerate(zip(actions, rewards, strict=True))
    ]
    return GroupRecord(
        gid or f"g-{task}-{random.random():.9f}", task, task_type, trajectories, iteration=iteration
    )


def converged(task: str, rewards: list[float], length: int = 10, **kw) -> GroupRecord:
    """Every trajectory takes the same actions (D_K = 0 at any K)."""
    return group(task, [[f"a{s}" for s in range(length)]] * len(rewards), rewards, **kw)


def divergent(task: str, rewards: list[float], length: int = 10, **kw) -> GroupRecord:
    """Every trajectory takes its own actions (D_K = 1 at any K)."""
    return group(task, [[f"t{i}-a{s}" for s in range(length)] for i in range(len(rewards))], rewards, **kw)


def partly(task: str, rewards: list[float], shared: int, length: int = 10, **kw) -> GroupRecord:
    """All trajectories share the first ``shared`` actions, then each goes its own way."""
    acts = [[f"a{s}" if s < shared else f"t{i}-a{s}" for s in range(length)] for i in range(len(rewards))]
    return group(task, acts, rewards, **kw)


def mixed_log(seed: int = 0, tasks: int = 30, reps: int = 2, g: int = 8) -> list[GroupRecord]:
    """A log in which a task's groups behave alike across repetitions: per task a success
    probability; groups of extreme tasks mostly converge, groups of middling ones scatter (with
    noise, so no single threshold separates them perfectly); and some tasks the policy is lost in
    (it scatters and always fails: zero-variance groups with a high D_K, which only history
    can tell apart)."""
    rng = random.Random(seed)
    kinds = [rng.choice([0.0, 0.0, 0.05, 0.5, 0.5, 0.95, 1.0, "lost"]) for _ in range(tasks)]
    out = []
    for rep in range(reps):
        for t, kind in enumerate(kinds):
            p = 0.0 if kind == "lost" else float(kind)
            spread = 0.15 + 0.7 * (1 - abs(p - 0.5) * 2) + rng.uniform(-0.15, 0.15)
            if kind == "lost":
                spread = rng.uniform(0.5, 0.8)
            acts, rewards = [], []
            for i in range(g):
                acts.append(
                    [f"a{s}" if rng.random() > spread else f"t{i}-{s}-{rng.randint(0, 2)}" for s in range(12)]
                )
                rewards.append(float(rng.random() < p))
            out.append(group(f"task{t}", acts, rewards, gid=f"it{rep}-g{t}", iteration=rep))
    return out


def typed_log(seed: int = 0, groups: int = 60, g: int = 8) -> list[GroupRecord]:
    """A log in which no task comes back but task types behave alike: the policy has mastered
    ``pick`` (always won, converged early), is lost at ``cool`` (always failed, scattered) and
    wins ``clean`` half of the time (converged early as often as the others, so D_K alone cannot
    tell its groups from the mastered ones)."""
    rng = random.Random(seed)
    out = []
    for n in range(groups):
        kind = rng.choice(["pick", "cool", "clean"])
        shared = rng.choice([2, 3, 4]) if kind != "cool" else rng.choice([0, 1, 2])
        acts = [[f"a{s}" if s < shared else f"t{i}-{s}" for s in range(10)] for i in range(g)]
        p = {"pick": 1.0, "cool": 0.0, "clean": 0.5}[kind]
        rewards = [float(rng.random() < p) for _ in range(g)]
        if kind == "clean":
            rewards[0], rewards[1] = 1.0, 0.0  # always mixed
        out.append(group(f"{kind}-{n}", acts, rewards, gid=f"g{n}", iteration=n // 10, task_type=kind))
    return out
