"""Prompts built token by token, action parsing, constrained choice settings."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from selective_rollout.config.agent import AgentConfig
from selective_rollout.envs.alfworld import Alfworld
from selective_rollout.rollout.actions import INVALID_ACTION, normalise, parse_action
from selective_rollout.rollout.agent import Agent
from selective_rollout.rollout.engines import SamplingParams

ADMISSIBLE = ["go to cabinet 1", "go to cabinet 10", "open fridge 1", "take mug 2 from countertop 1", "look"]

PROMPT = Alfworld.prompt  # the agent is worded for one game; these tests use ALFWorld's


@pytest.fixture(scope="module")
def agent(smollm2_tokenizer):
    return Agent(AgentConfig(history_turns=4), smollm2_tokenizer, PROMPT)


def reply_ids(tok, text: str, ended: bool) -> list[int]:
    ids = tok(text, add_special_tokens=False).input_ids
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")] if ended else ids


def test_incremental_prompt_equals_a_from_scratch_rendering(agent, smollm2_tokenizer):
    """prompt_{t+1} == prompt_t + completion_t + appended_t, and equals the template's own rendering."""
    tok = smollm2_tokenizer
    conv = agent.start("put a mug in the fridge", "You are in the middle of a room.", ADMISSIBLE)
    replies = ["go to cabinet 1", "open fridge 1", "look"]
    users = [
        "Task: put a mug in the fridge\n\nObservation: You are in the middle of a room.\n\n"
        + "Admissible actions:\n"
        + "\n".join(f"- {a}" for a in ADMISSIBLE)
    ]
    for t, reply in enumerate(replies):
        before = list(conv.prompt_ids)
        completion = reply_ids(tok, reply, ended=True)
        conv.add_completion(completion, reply)
        appended, new_segment = conv.extend(f"Observation {t}.", ADMISSIBLE[:2])
        assert not new_segment
        assert conv.prompt_ids == before + completion + appended
        users.append(
            f"Observation: Observation {t}.\n\nAdmissible actions:\n- go to cabinet 1\n- go to cabinet 10"
        )
    messages = [{"role": "system", "content": agent.builder.system}]
    for user, reply in zip(users, [*replies, None], strict=True):
        messages.append({"role": "user", "content": user})
        if reply is not None:
            messages.append({"role": "assistant", "content": reply})
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert conv.prompt_ids == tok(rendered, add_special_tokens=False).input_ids


def test_listing_once_sends_the_commands_only_in_a_segments_first_turn(smollm2_tokenizer):
    """admissible_in_prompt=first_turn: later turns carry only the observation, the system prompt
    says so, and a new segment lists the commands again (its first turn must stand alone)."""
    tok = smollm2_tokenizer
    cfg = AgentConfig(history_turns=2, admissible_in_prompt="first_turn")
    agent = Agent(cfg, tok, PROMPT)
    assert "list of admissible" not in agent.builder.system
    conv = agent.start("put a mug in the fridge", "You are in the middle of a room.", ADMISSIBLE)
    assert "Admissible actions:" in tok.decode(conv.prompt_ids)
    every_turn = Agent(AgentConfig(history_turns=2), tok, PROMPT).start("t", "o", ADMISSIBLE)
    for t, reply in enumerate(["go to cabinet 1", "open fridge 1", "look"]):
        ids = reply_ids(tok, reply, ended=True)
        conv.add_completion(ids, reply)
        appended, new_segment = conv.extend(f"Observation {t}.", ADMISSIBLE)
        text = tok.decode(appended)
        assert f"Observation {t}." in text
        assert ("Admissible actions:" in text) == new_segment  # only a fresh segment re-lists them
        every_turn.add_completion(ids, reply)
        listed, _ = every_turn.extend(f"Observation {t}.", ADMISSIBLE)
        if not new_segment:
            assert len(appended) < len(listed) - 20  # the saving the option exists for
    assert new_segment  # history_turns=2: the third turn opened a segment


def test_listing_once_needs_constrained_decoding():
    with pytest.raises(ValidationError, match="constrain_to_admissible"):
        AgentConfig(admissible_in_prompt="first_turn", constrain_to_admissible=False)


def test_loss_mask_marks_exactly_the_policys_tokens(agent, smollm2_tokenizer):
    conv = agent.start("task", "obs", ADMISSIBLE)
    n0 = len(conv.prompt_ids)
    completion = reply_ids(smollm2_tokenizer, "look", ended=True)
    conv.add_completion(completion, "look")
    appended, _ = conv.extend("obs 2", ADMISSIBLE)
    assert conv.loss_mask == [0] * n0 + [1] * len(completion) + [0] * len(appended)
    assert len(conv.loss_mask) == len(conv.prompt_ids)


def test_a_reply_cut_by_length_gets_its_end_of_turn_added(agent, smollm2_tokenizer):
    eot = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    conv = agent.start("task", "obs", ADMISSIBLE)
    conv.add_completion(reply_ids(smollm2_tokenizer, "go to", ended=False), "go to")
    appended, _ = conv.extend("obs 2", ADMISSIBLE)
    assert appended[0] == eot
    conv.add_completion(reply_ids(smollm2_tokenizer, "look", ended=True), "look")
    appended, _ = conv.extend("obs 3", ADMISSIBLE)
    assert appended[0] != eot


def test_history_window_starts_a_new_segment(agent, smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv = agent.start("find the mug", "start obs", ADMISSIBLE)
    flags = []
    for t in range(7):
        conv.add_completion(reply_ids(tok, ADMISSIBLE[t % 5], ended=True), ADMISSIBLE[t % 5])
        appended, new_segment = conv.extend(f"obs {t}", ADMISSIBLE)
        flags.append(new_segment)
        if new_segment:
            assert appended == conv.prompt_ids and set(conv.loss_mask) == {0}
            text = tok.decode(conv.prompt_ids)
            assert "Task: find the mug" in text and f"obs {t}" in text and "start obs" not in text
    assert flags == [False, False, False, False, True, False, False]
    assert conv.segment_index == 1


def test_extend_without_the_completion_is_an_error(agent):
    conv = agent.start("task", "obs", ADMISSIBLE)
    with pytest.raises(RuntimeError, match="add_completion"):
        conv.extend("obs", ADMISSIBLE)


def test_sampling_adds_the_admissible_choices_only_when_constrained(smollm2_tokenizer):
    base = SamplingParams(max_tokens=16)
    on = Agent(AgentConfig(), smollm2_tokenizer, PROMPT).sampling(ADMISSIBLE + ["look"], base)
    assert on.choices == ADMISSIBLE and on.max_tokens == 16 and base.choices is None
    off = Agent(AgentConfig(constrain_to_admissible=False), smollm2_tokenizer, PROMPT).sampling(
        ADMISSIBLE, base
    )
    assert off.choices is None


def test_react_with_constrained_choice_is_a_config_error():
    with pytest.raises(ValidationError, match="constrain_to_admissible"):
        AgentConfig(action_format="react", constrain_to_admissible=True)


@pytest.mark.parametrize(
    ("reply", "fmt", "command", "match"),
    [
        ("open fridge 1", "action", "open fridge 1", "exact"),
        ("  Open Fridge-1.\nmore text", "action", "open fridge 1", "normalised"),
        ("Action: go to cabinet 10", "action", "go to cabinet 10", "exact"),
        ("take mug 2 from countertp 1", "action", "take mug 2 from countertop 1", "fuzzy"),
        (
            "Thought: the mug may be in a cabinet.\nAction: go to cabinet 1",
            "react",
            "go to cabinet 1",
            "exact",
        ),
        ("Thought: I should look.\naction:  LOOK ", "react", "look", "normalised"),
        ("Thought: no action here, go to cabinet 1", "react", INVALID_ACTION, "invalid"),
        ("go to cabinet", "action", INVALID_ACTION, "invalid"),  # equally close to 1 and 10: no guess
        ("dance wildly", "action", INVALID_ACTION, "invalid"),
        ("", "action", INVALID_ACTION, "invalid"),
        ("!!!???", "action", INVALID_ACTION, "invalid"),
    ],
)
def test_parse_action(reply, fmt, command, match):
    parsed = parse_action(reply, ADMISSIBLE, fmt)
    assert (parsed.command, parsed.match, parsed.valid) == (command, match, match != "invalid")


def test_parse_survives_a_very_long_reply():
    long = "".join(random.Random(0).choice("abc xyz\n:") for _ in range(1_000_000))
    parsed = parse_action(long + "\nAction: look", ADMISSIBLE, "react")
    assert parsed.command in [*ADMISSIBLE, INVALID_ACTION]
    assert len(parsed.extracted) <= 200


@pytest.mark.parametrize(
    ("reply", "fmt", "command", "valid"),
    [
        ("look around\n#### 42", "action", "look around\n#### 42", True),  # the whole reply, as is
        ("Thought: count.\nAction: say 3\nthen stop", "react", "say 3\nthen stop", True),
        # no action written: the one invalid token the gate and the env know, never an empty command
        ("Thought: no action line", "react", INVALID_ACTION, False),
        ("   ", "action", INVALID_ACTION, False),
    ],
)
def test_with_nothing_admissible_the_reply_is_a_free_text_action(reply, fmt, command, valid):
    parsed = parse_action(reply, [], fmt)
    assert (parsed.command, parsed.valid) == (command, valid)
    assert parsed.match == ("free" if valid else "invalid")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.sampled_from(["react", "action"]))
def test_parse_never_raises_on_any_text(reply, fmt):
    parsed = parse_action(reply, ADMISSIBLE, fmt)
    assert parsed.command in ADMISSIBLE or (parsed.command == INVALID_ACTION and not parsed.valid)


def test_normalise():
    assert normalise("  Go to Cabinet-1. ") == "go to cabinet 1"
