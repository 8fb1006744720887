"""Proof that an update reaches the engines, made certain instead of left to the rollouts.

A first-node smoke run or a cluster rehearsal plays a small untrained model: most of its groups
end with one reward (all fail), GRPO then has nothing to learn, the learner skips its step and
the run never shows that an update is computed, sent and served. ``driver.update_check`` removes
that luck: right after the start-up sync the driver takes one optimiser step on a constructed
group of two replies to one prompt whose rewards differ (so the advantages are +1 and -1 and do
not cancel), syncs, has every engine verified as usual (``weight_sync.served``), and requires
that engine 0 now scores the probe differently from before the step. The step is real (it
changes the policy a run starts from), which is why the check is off unless a smoke or rehearsal
asks for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from selective_rollout.records import Experience

GROUP_ID = "update-check"
# One prompt and two replies that differ from their first token on (a shared reply would give
# both trajectories the same gradient, which the opposite advantages cancel exactly).
PROMPT = (
    "You are in the middle of a kitchen. You see a cabinet 1, a fridge 1 and a countertop 1. "
    "Your task is to: put a clean apple in the fridge.\n"
)
REPLIES = ("Action: go to countertop 1", "Thought: open the cabinet first.\nAction: open cabinet 1")
REWARDS = (1.0, 0.0)


class UpdateCheckFailed(RuntimeError):
    """The constructed update did not move the learner's or the engines' weights."""


def check_batch(
    prompt_ids: Sequence[int], reply_ids: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]]
) -> list[Experience]:
    """The constructed group: one Experience per reply, its reply tokens in the loss.

    ``logprobs[i]`` is the learner's own log-prob of every token of prompt + reply ``i`` after the
    first (``LearnerGroup.logprobs``): as the behaviour log-probs the importance ratio is 1 and the
    step is the plain policy gradient of the two rewards."""
    if len(reply_ids) != len(REWARDS) or len(logprobs) != len(REWARDS):
        raise ValueError(f"the update check needs {len(REWARDS)} replies and their log-probs")
    batch = []
    for index, (reply, lps, reward) in enumerate(zip(reply_ids, logprobs, REWARDS, strict=True)):
        ids = [*prompt_ids, *reply]
        if not prompt_ids or not reply or len(lps) != len(ids) - 1:
            raise ValueError(f"reply {index}: {len(lps)} log-probs for {len(ids)} tokens")
        mask = [0] * len(prompt_ids) + [1] * len(reply)
        old = [lp if m else 0.0 for lp, m in zip([0.0, *lps], mask, strict=True)]
        batch.append(Experience(GROUP_ID, GROUP_ID, "check", ids, mask, old, reward, trajectory=index))
    return batch


def served_shift(before: Sequence[float], after: Sequence[float]) -> float:
    """Mean absolute change of one engine's probe log-probs across the update (nats)."""
    if len(before) != len(after) or not before:
        raise UpdateCheckFailed(f"the probe was scored over {len(before)} and then {len(after)} tokens")
    return sum(abs(a - b) for a, b in zip(before, after, strict=True)) / len(before)


def verdict(train_metrics: dict[str, float], shift: float) -> dict[str, float]:
    """The check's ``check/`` metrics; raises ``UpdateCheckFailed`` with what did not move."""
    if train_metrics.get("train/skipped") or "train/loss" not in train_metrics:
        raise UpdateCheckFailed("the learner skipped the constructed update: it found no advantage")
    grad = train_metrics.get("train/grad_norm", 0.0)
    if not grad > 0:
        raise UpdateCheckFailed(f"the constructed update had gradient norm {grad}: nothing was learned")
    if not shift > 0:
        raise UpdateCheckFailed(
            "after the constructed update and its sync, engine 0 scores the probe exactly as "
            "before: the update did not reach the served weights"
        )
    return {
        "check/loss": train_metrics["train/loss"],
        "check/grad_norm": grad,
        "check/served_shift": shift,
    }
