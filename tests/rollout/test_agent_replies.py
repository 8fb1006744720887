"""The agent with environments in the ecosystem's shape: the environment's own first messages
(its system prompt in place of the project's), message observations rendered as given, free-text
wording, the environment's stop strings in every turn's sampling and the transformers engine
ending a reply at a stop string. On SmolLM2's real tokenizer and model."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from selective_rollout.config import load_config
from selective_rollout.config.agent import AgentConfig
from selective_rollout.envs.base import PromptText
from selective_rollout.rollout.agent import Agent
from selective_rollout.rollout.engines import SamplingParams
from selective_rollout.rollout.prompts import system_prompt
from selective_rollout.rollout.turns import EngineSlots, Turns

FREE = PromptText(world="a conversation game", commands="", free_text=True)
OPENING = [
    {"role": "system", "content": "You are in a conversation game."},
    {"role": "user", "content": "Tell me about the number 3."},
]


def reply_ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids("<|im_end|>")]


def rendered_ids(tok, messages: list[dict[str, str]]) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False).input_ids


def test_the_environments_first_and_later_messages_are_the_prompt(smollm2_tokenizer):
    """The opening messages, system included, replace the project's prompt; each observation's
    messages follow the reply as given; incremental ids equal the template's rendering."""
    tok = smollm2_tokenizer
    conv = Agent(AgentConfig(history_turns=8), tok, FREE).start("t", "obs", [], OPENING)
    assert conv.prompt_ids == rendered_ids(tok, OPENING)
    messages = list(OPENING)
    for turn, reply in enumerate(["Three is odd.", "It is prime."]):
        before = list(conv.prompt_ids)
        completion = reply_ids(tok, reply)
        conv.add_completion(completion, reply)
        observation = [{"role": "user", "content": f"Turn {turn + 1} heard. Go on."}]
        appended, new_segment = conv.extend("ignored text", [], observation)
        assert not new_segment and conv.prompt_ids == before + completion + appended
        messages += [{"role": "assistant", "content": reply}, *observation]
    assert conv.prompt_ids == rendered_ids(tok, messages)


def test_without_a_system_message_the_projects_prompt_is_not_added(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv = Agent(AgentConfig(), tok, FREE).start("t", "obs", [], OPENING[1:])
    assert conv.prompt_ids == rendered_ids(tok, OPENING[1:])  # the template's own default, if any


def test_a_later_segment_opens_with_the_environments_first_messages(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv = Agent(AgentConfig(history_turns=2), tok, FREE).start("t", "obs", [], OPENING)
    history = []
    for turn in range(4):
        conv.add_completion(reply_ids(tok, f"reply {turn}"), f"reply {turn}")
        observation = [{"role": "user", "content": f"observation {turn}"}]
        _, new_segment = conv.extend("", [], observation)
        history.append((f"reply {turn}", observation))
        if new_segment:
            break
    assert new_segment and conv.segment_index == 1
    # the window keeps the last history_turns // 2 = 1 exchange, led by the opening messages
    (last_reply, last_obs) = history[-1]
    previous_obs = history[-2][1]
    expected = [*OPENING, *previous_obs, {"role": "assistant", "content": last_reply}, *last_obs]
    assert conv.prompt_ids == rendered_ids(tok, expected)


def test_text_observations_of_a_free_text_game_list_no_commands(smollm2_tokenizer):
    conv = Agent(AgentConfig(constrain_to_admissible=False), smollm2_tokenizer, FREE).start(
        "guess", "A room.", []
    )
    text = smollm2_tokenizer.decode(conv.prompt_ids)
    assert "Admissible actions" not in text and "Observation: A room." in text
    assert "Reply with your next action" in system_prompt("action", FREE)
    assert "admissible" not in system_prompt("react", FREE)


def test_every_turn_is_sampled_with_the_environments_stop_strings(smollm2_tokenizer):
    cfg = load_config(None, ['env.stop=[</answer>, "\\n\\n"]'])
    agent = Agent(cfg.agent, smollm2_tokenizer, FREE)
    turns = Turns(cfg, EngineSlots([object()], 1.0), None, cfg.env.build(), agent)
    group = SimpleNamespace(sample_key="k")
    traj = SimpleNamespace(index=0, steps=[], admissible=[])
    assert turns._sampling(group, traj).stop == ["</answer>", "\n\n"]
    plain = load_config(None)
    turns = Turns(plain, EngineSlots([object()], 1.0), None, plain.env.build(), agent)
    assert turns._sampling(group, traj).stop is None  # no stop strings: the request as before


def test_the_transformers_engine_ends_a_reply_at_a_stop_string(hf_engine):
    """Greedy decoding without, then with, a stop string taken from the first reply: the second
    reply is the first one's prefix up to the token that completes it, finished "stop"."""
    tok = hf_engine.tokenizer
    messages = [{"role": "user", "content": "Name three kitchen objects."}]
    free = asyncio.run(hf_engine.generate("free", messages, SamplingParams(max_tokens=16, temperature=0)))
    ids = free.outputs[0].token_ids
    cut = next(
        j
        for j in range(1, len(ids))
        if tok.decode(ids[j : j + 1]).strip() and tok.decode(ids[j : j + 1]) not in tok.decode(ids[:j])
    )
    stop = tok.decode(ids[cut : cut + 1])
    sampling = SamplingParams(max_tokens=16, temperature=0, stop=[stop])
    out = asyncio.run(hf_engine.generate("stopped", messages, sampling)).outputs[0]
    assert out.token_ids == ids[: cut + 1] and out.finish_reason == "stop"
    assert out.text.endswith(stop)


@pytest.mark.parametrize("stop", [[""], [3]])
def test_stop_strings_must_be_non_empty_strings(stop):
    with pytest.raises(ValueError, match=r"SamplingParams\.stop"):
        SamplingParams(stop=stop).validate()
