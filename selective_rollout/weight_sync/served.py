"""Proof that an engine serves the weights it was sent: teacher-forced log-probs of one fixed probe.

A sync can complete and still leave an engine serving other weights: a back-end that repacks
weights after loading (vLLM's layer-wise reload), a retry after a called-off sync, a tensor-parallel
shard loaded twice. Sums of parameters cannot tell (vLLM on CPU keeps its linear weights in packed
handles it does not expose), but the model's output can: after every sync the driver scores one
fixed probe on the learner and on every engine and refuses to go on when they disagree beyond a
tolerance that covers numerics (dtype, kernels) and nothing else. Wrong weights move log-probs by
nats; bf16-against-fp32 numerics by hundredths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# An ALFWorld-like turn: ordinary text, so the probe runs the layers the rollouts run.
PROBE_TEXT = (
    "You are in the middle of a kitchen. Looking quickly around you, you see a cabinet 1, a fridge 1, "
    "a countertop 1 and a sinkbasin 1. Your task is to: put a clean apple in the fridge.\n"
    "Thought: the apple may be on the countertop.\nAction: go to countertop 1"
)


class ServedWeightsMismatch(RuntimeError):
    """An engine scores the probe unlike the learner after a sync: it serves other weights."""


def logprob_gap(want: Sequence[float], got: Sequence[float]) -> float:
    """Mean absolute difference of two teacher-forced log-prob sequences of one probe (nats)."""
    if len(want) != len(got) or not want:
        raise ServedWeightsMismatch(
            f"the probe was scored over {len(got)} tokens, the learner's over {len(want)}"
        )
    return sum(abs(a - b) for a, b in zip(want, got, strict=True)) / len(want)


def check_served(
    want: Sequence[float], served: Mapping[str, Sequence[float]], tol: float
) -> dict[str, float]:
    """Each engine's gap to the learner (``served``: engine label -> its log-probs of the probe);
    raises ``ServedWeightsMismatch`` naming every engine whose gap exceeds ``tol``."""
    gaps = {label: logprob_gap(want, got) for label, got in served.items()}
    if off := {label: gap for label, gap in gaps.items() if gap > tol}:
        named = ", ".join(f"{label} {gap:.3g}" for label, gap in off.items())
        raise ServedWeightsMismatch(
            f"after the weight sync, {named} nats mean |log-prob gap| to the learner on the probe "
            f"(tolerance {tol:g}): the engine does not serve the learner's weights"
        )
    return gaps
