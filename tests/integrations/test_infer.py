"""The inference-time gate against a real local server (SmolLM2 over HTTP, loopback)."""

from __future__ import annotations

import asyncio

import pytest

from selective_rollout.gate import build_gate
from selective_rollout.integrations.agent_loop import LoopConfig
from selective_rollout.integrations.infer import compare, summarise
from selective_rollout.integrations.serve import serve_subprocess


@pytest.fixture(scope="module")
def base_url(smollm2_path):
    with serve_subprocess(smollm2_path) as url:
        yield url


def test_converged_samples_keep_one_survivor_and_save_tokens(base_url, tiny_games) -> None:
    from alfworld_env import load_games

    game = load_games(tiny_games, "train")[0].game_dir
    cfg = LoopConfig(model="smollm2", max_steps=3, max_tokens=16, temperature=0.0)
    # greedy: the samples agree on every action, D_1 = 0, the gate fires at step 1
    (row,) = asyncio.run(compare(base_url, cfg, [game], g=3, gate=build_gate("prefix_edit", k=1, tau=0.12)))
    assert row.fired and row.cut_step == 1
    assert row.gated_tokens < row.full_tokens  # two of three samples stopped after one reply
    assert row.agree
    s = summarise([row])
    assert s["tokens_saved_frac"] > 0.3 and s["answer_agreement"] == 1.0


def test_an_error_from_the_endpoint_names_it(base_url, tiny_games) -> None:
    from alfworld_env import load_games
    from selective_rollout.rollout.engines.base import EngineError

    game = load_games(tiny_games, "train")[0].game_dir
    cfg = LoopConfig(model="no-such-model", max_steps=1, max_tokens=4)
    with pytest.raises(EngineError, match="chat/completions answered 404"):
        asyncio.run(compare(base_url, cfg, [game], g=2, gate=build_gate("none")))
