"""Multi-turn packing: one forward pass per trajectory, micro-batches by token budget.

The paper runs one forward per step (each step's prompt is the whole history so far), which
recomputes the shared prefix once per turn. Here a trajectory's whole dialogue is one sequence
and the loss mask selects the policy's own tokens; a causal model gives every reply token the
same context either way, so the loss is the same at a fraction of the tokens.
``per_step_segments`` rebuilds the per-step view for the equivalence test and the bench.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from selective_rollout.records import Experience


@dataclass
class MicroBatch:
    """Right-padded ``[B, T]`` inputs; the ``[B, T-1]`` fields are aligned to the predicted token.

    ``stale`` holds each policy token's staleness (learner updates since the weights its sampling
    depended on; a reply can span an update that reached the engine mid-rollout). ``choice_ids``
    (``[B, T-1, C]``) lists the ids a constrained choice allowed for each predicted token, padded
    with -1 (all -1: sampled from the whole vocabulary).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    choice_ids: torch.Tensor
    stale: torch.Tensor  # [B, T-1]: learner updates the sampling weights lagged (0: on-policy)

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(*(t.to(device) for t in vars(self).values()))


def check_experience(exp: Experience) -> None:
    """Reject what cannot be trained on, naming the group: nothing predicts a first token."""
    if len(exp.token_ids) < 2:
        raise ValueError(
            f"experience of group {exp.group_id}: needs at least 2 tokens, got {len(exp.token_ids)}"
        )
    if exp.loss_mask[0]:
        raise ValueError(f"experience of group {exp.group_id}: the first token cannot be a policy token")


def plan_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sequence indices so that each micro-batch's padded size ``B * max_len`` fits the budget.

    Longest first, so sequences of similar length share a micro-batch and padding stays small;
    a sequence longer than the budget gets a micro-batch of its own (it cannot be split without
    changing its context).
    """
    plans: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if plans and (len(plans[-1]) + 1) * lengths[plans[-1][0]] <= token_budget:
            plans[-1].append(i)
        else:
            plans.append([i])
    return plans


def collate(
    batch: Sequence[Experience],
    advantages: Sequence[float],
    pad_id: int = 0,
    staleness: Sequence[Sequence[int]] | None = None,
) -> MicroBatch:
    """Pad a list of experiences into one micro-batch; each advantage is broadcast over its tokens,
    ``staleness`` gives each experience's per-token lags (``Experience.token_lags``; default 0)."""
    if len(batch) != len(advantages):
        raise ValueError(f"collate: {len(batch)} experiences but {len(advantages)} advantages")
    width = max(len(e.token_ids) for e in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), width - 1), dtype=torch.float32)
    old_logprobs = torch.zeros((len(batch), width - 1), dtype=torch.float32)
    stale = torch.zeros((len(batch), width - 1), dtype=torch.float32)
    widest = max((len(a) for e in batch for a in e.choice_sets.values()), default=1)
    choice_ids = torch.full((len(batch), width - 1, widest), -1, dtype=torch.long)
    for row, exp in enumerate(batch):
        check_experience(exp)
        n = len(exp.token_ids)
        input_ids[row, :n] = torch.tensor(exp.token_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        loss_mask[row, : n - 1] = torch.tensor(exp.loss_mask[1:], dtype=torch.float32)
        old_logprobs[row, : n - 1] = torch.tensor(exp.old_logprobs[1:], dtype=torch.float32)
        if staleness is not None:
            stale[row, : n - 1] = torch.tensor(list(staleness[row])[1:], dtype=torch.float32)
        for pos, allowed in exp.choice_sets.items():
            if pos > 0:  # position 0 is never predicted (nor a policy token: check_experience)
                choice_ids[row, pos - 1, : len(allowed)] = torch.tensor(allowed, dtype=torch.long)
    adv = torch.tensor(list(advantages), dtype=torch.float32)[:, None].expand_as(loss_mask).contiguous()
    return MicroBatch(
        input_ids,
        attention_mask,
        loss_mask,
        old_logprobs * loss_mask,
        adv * loss_mask,
        choice_ids,
        stale * loss_mask,
    )


def empty_micro_batch(pad_id: int = 0) -> MicroBatch:
    """A micro-batch with no policy token: its loss is an exact 0 with a full graph.

    Learners with fewer micro-batches than their peers run these so that every rank makes the
    same number of backward passes (ZeRO-2/3 reduce gradients inside each backward).
    """
    return collate([Experience("<pad>", "", "", [pad_id, pad_id], [0, 0], [0.0, 0.0], 0.0)], [0.0], pad_id)


def per_step_segments(exp: Experience) -> list[Experience]:
    """The paper's view of a trajectory: one sequence per reply, holding the whole history before it."""
    segments = []
    mask = exp.loss_mask
    t = 0
    while t < len(mask):
        if not mask[t]:
            t += 1
            continue
        start = t
        while t < len(mask) and mask[t]:
            t += 1
        seg_mask = [0] * start + [1] * (t - start)
        seg_lp = [0.0] * start + list(exp.old_logprobs[start:t])
        seg_sets = {pos: allowed for pos, allowed in exp.choice_sets.items() if start <= pos < t}
        segments.append(
            replace(
                exp,
                token_ids=list(exp.token_ids[:t]),
                loss_mask=seg_mask,
                old_logprobs=seg_lp,
                choice_sets=seg_sets,
            )
        )
    return segments
