"""The dialogue owner: the prompts the engine sees are the sequences the learner packs.

On SmolLM2's real tokenizer: every turn's ids land once, prompts and observations with loss mask
0 and log-prob 0.0, the policy's reply with mask 1 and the engine's log-probs; a full history
window opens a segment on a fresh prompt; a trajectory's last reply (no ``extend`` after it)
still trains.
"""

from __future__ import annotations

import dataclasses

import pytest

from selective_rollout.config.agent import AgentConfig
from selective_rollout.envs.alfworld import Alfworld
from selective_rollout.rollout.agent import Agent
from selective_rollout.rollout.dialogue import GeneratedTurn

ADMISSIBLE = ["go to cabinet 1", "open fridge 1", "look"]

PROMPT = Alfworld.prompt  # the agent is worded for one game; these tests use ALFWorld's


@pytest.fixture(scope="module")
def agent(smollm2_tokenizer):
    return Agent(AgentConfig(history_turns=2), smollm2_tokenizer, PROMPT)


def reply(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids("<|im_end|>")]


def test_segments_hold_every_turn_once_with_the_mask_and_logprobs(agent, smollm2_tokenizer):
    """The segments equal what the coordinator used to copy by hand: the first prompt, then per turn
    the completion (mask 1, its log-probs) and what ``extend`` appended (mask 0), a fresh prompt
    opening each new segment; the last reply is kept without an ``extend``."""
    tok = smollm2_tokenizer
    conv = agent.start("put a mug in the fridge", "You are in a room.", ADMISSIBLE)
    expected = [(list(conv.prompt_ids), [0] * len(conv.prompt_ids), [0.0] * len(conv.prompt_ids))]
    for t in range(6):
        ids = reply(tok, ADMISSIBLE[t % 3])
        logprobs = [-0.1 * (j + 1) for j in range(len(ids))]
        prompt = list(conv.prompt_ids)
        conv.add_completion(tuple(ids), ADMISSIBLE[t % 3], tuple(logprobs))
        assert conv.prompt_ids == prompt + ids  # the engine's prompt and the learner's ids are one list
        ids_, mask, lps = expected[-1]
        ids_ += ids
        mask += [1] * len(ids)
        lps += logprobs
        if t == 5:
            break  # the trajectory ended: no next turn
        appended, new_segment = conv.extend(f"Observation {t}.", ADMISSIBLE)
        if new_segment:
            expected.append(([], [], []))
        expected[-1][0].extend(appended)
        expected[-1][1].extend([0] * len(appended))
        expected[-1][2].extend([0.0] * len(appended))
    assert conv.segment_index == 2 and len(conv.segments) == 3  # history_turns=2: turns 3 and 5 roll over
    exps = conv.experiences("g1", "task-1", "pick", reward=1.0, trajectory=3)
    assert [(e.token_ids, e.loss_mask, e.old_logprobs) for e in exps] == expected
    assert all(
        (e.group_id, e.task_id, e.task_type, e.reward, e.trajectory) == ("g1", "task-1", "pick", 1.0, 3)
        for e in exps
    )
    # a later segment opens on a fresh prompt that restates the task
    for e in exps[1:]:
        fresh = tok.decode(e.token_ids[: e.loss_mask.index(1)])
        assert "Task: put a mug in the fridge" in fresh and tok.decode(e.token_ids[:3]) == tok.decode(
            exps[0].token_ids[:3]
        )


def test_an_expert_reply_has_zero_logprobs_and_a_segment_without_a_reply_is_not_trained(
    agent, smollm2_tokenizer
):
    """The warm start's expert replies carry no sampling log-probs; a segment that a cut ended
    before its first reply holds no policy token and yields no Experience."""
    tok = smollm2_tokenizer
    conv = agent.start("find a mug", "You are in a room.", ADMISSIBLE)
    for t in range(3):
        conv.add_completion(reply(tok, "look"), "look")
        _, new_segment = conv.extend(f"obs {t}", ADMISSIBLE)
    assert new_segment  # history_turns=2: the third extend opened a segment, then the group was cut
    (exp,) = conv.experiences("g", "t", "", reward=0.0)
    assert exp.old_logprobs == [0.0] * len(exp.token_ids)
    assert sum(exp.loss_mask) == 3 * len(reply(tok, "look"))


def test_each_reply_token_keeps_the_version_the_engine_gave_it(agent, smollm2_tokenizer):
    """A reply's per-token versions (``CompletionOutput.versions``) reach its Experience on the
    reply's tokens, -1 elsewhere; a conversation whose engine gave none has no token versions."""
    tok = smollm2_tokenizer
    conv = agent.start("put a mug in the fridge", "You are in a room.", ADMISSIBLE)
    start = len(conv.prompt_ids)
    ids = reply(tok, "look")
    conv.add_completion(ids, "look", [-0.5] * len(ids), [3] * (len(ids) - 1) + [4])
    (exp,) = conv.experiences("g", "t", "", reward=0.0)
    assert exp.token_versions == [-1] * start + [3] * (len(ids) - 1) + [4]
    plain = agent.start("put a mug in the fridge", "You are in a room.", ADMISSIBLE)
    plain.add_completion(ids, "look", [-0.5] * len(ids))
    assert plain.experiences("g", "t", "", reward=0.0)[0].token_versions == []


def test_a_generated_turn_is_frozen():
    turn = GeneratedTurn("look", True, "look", (1, 2), (-0.5, -0.25), prompt_tokens=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        turn.command = "go"  # type: ignore[misc]


def test_constrained_replies_carry_what_the_choice_allowed_at_each_token(smollm2_tokenizer):
    """With constrained choice, each reply token of the Experience names the ids the engine's trie
    allowed before it: the commands' distinct first tokens, then one id wherever the command was
    already decided; a reply that leaves the trie (a tokenisation the trie does not hold) keeps the
    sets up to there; without constraint no token has a set."""
    tok = smollm2_tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    constrained = Agent(AgentConfig(history_turns=4, constrain_to_admissible=True), tok, PROMPT)
    conv = constrained.start("put a mug in the fridge", "You are in a room.", ADMISSIBLE)
    start = len(conv.prompt_ids)
    ids = reply(tok, "go to cabinet 1")
    conv.add_completion(ids, "go to cabinet 1", [-0.5] * len(ids))
    conv.extend("Nothing happens.", ADMISSIBLE)
    odd = [*tok("lo", add_special_tokens=False).input_ids, *tok("ok", add_special_tokens=False).input_ids]
    second = len(conv.prompt_ids)
    conv.add_completion(odd, "look", [-0.5] * len(odd))
    (exp,) = conv.experiences("g", "t", "", reward=0.0)

    firsts = {tok(c, add_special_tokens=False).input_ids[0] for c in ADMISSIBLE}
    sets = [exp.choice_sets[start + i] for i in range(len(ids))]
    assert set(sets[0]) == firsts and len(firsts) == 3
    assert all(len(s) == 1 for s in sets[1:])  # "go" decides "go to cabinet 1" among these three
    assert sets[-1] == (eot,)
    assert {pos for pos in exp.choice_sets if pos >= second} <= {second}  # "lo" + "ok" leaves the trie
    assert all(exp.loss_mask[pos] for pos in exp.choice_sets)

    unconstrained = AgentConfig(
        history_turns=4, constrain_to_admissible=False, admissible_in_prompt="every_turn"
    )
    free = Agent(unconstrained, tok, PROMPT).start("t", "o", ADMISSIBLE)
    free.add_completion(ids, "go to cabinet 1", [-0.5] * len(ids))
    assert free.experiences("g", "t", "", reward=0.0)[0].choice_sets == {}
