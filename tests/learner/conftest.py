"""Trainer test fixtures: a tiny random Llama saved like a real checkpoint, and synthetic dialogues."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from selective_rollout.records import Experience

VOCAB = 96


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two layers, hidden 32: same architecture family as SmolLM2, a few hundred KB, tied embeddings."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def dialogue(rng: random.Random, turns: int, group_id: str, reward: float) -> Experience:
    """prompt, then ``turns`` x (policy reply, observation), ending on a reply: a multi-turn trajectory."""
    ids, mask = [], []
    for t in range(turns):
        n_obs = rng.randint(3, 7)
        n_reply = rng.randint(2, 5)
        ids += [rng.randrange(VOCAB) for _ in range(n_obs + n_reply)]
        mask += [0] * n_obs + [1] * n_reply
        del t
    old = [-4.5 + rng.uniform(-0.3, 0.3) if m else 0.0 for m in mask]
    return Experience(group_id, "task-" + group_id, "pick", ids, mask, old, reward)


def assert_same_direction_and_size(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to float32 rounding (HF's RMSNorm computes in fp32 even in an fp64 model)."""
    assert expected.norm() > 0
    assert ((actual - expected).norm() / expected.norm()).item() < 1e-6


def make_batch(seed: int, rewards: dict[str, list[float]], turns: int = 3) -> list[Experience]:
    """One experience per reward; ``rewards`` maps group id -> the G rewards of that group."""
    rng = random.Random(seed)
    return [dialogue(rng, turns, gid, r) for gid, rs in rewards.items() for r in rs]


def with_choices(exp: Experience, rng: random.Random) -> Experience:
    """``exp`` as if each reply had been a constrained choice: its first token a decision among
    three ids (the sampled one and two others), every later reply token forced."""
    sets: dict[int, tuple[int, ...]] = {}
    for pos, m in enumerate(exp.loss_mask):
        if not m:
            continue
        tok = exp.token_ids[pos]
        if exp.loss_mask[pos - 1]:
            sets[pos] = (tok,)
        else:
            others = rng.sample([t for t in range(VOCAB) if t != tok], 2)
            sets[pos] = (others[0], tok, others[1])
    return Experience(**{**vars(exp), "choice_sets": sets})
