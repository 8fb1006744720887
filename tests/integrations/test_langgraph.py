"""The LangGraph node over a real local server (SmolLM2 over HTTP, loopback) and real games."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from prometheus_client.parser import text_string_to_metric_families

from selective_rollout.gate import build_gate
from selective_rollout.integrations.agent_loop import EpisodeSource, LoopConfig
from selective_rollout.integrations.langgraph import GatedSamples, gated_graph
from selective_rollout.integrations.serve import serve_subprocess

GREEDY = LoopConfig(model="smollm2", max_steps=3, max_tokens=16, temperature=0.0)
SAMPLED = LoopConfig(model="smollm2", max_steps=3, max_tokens=12, temperature=1.0, seed=7)


def server_counts(base_url: str) -> dict[str, int]:
    """The server's own counters (requests, requests_finished, requests_aborted,
    generation_tokens), read from its Prometheus ``/metrics``."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    return {
        sample.name.removeprefix("selective_rollout_").removesuffix("_total"): int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def settled_counts(base_url: str, before: dict[str, int]) -> dict[str, int]:
    """What the server counted since ``before``, once no request is left running (it notices a
    closed connection a moment after the client closes it)."""
    for _ in range(100):
        now = server_counts(base_url)
        delta = {k: now[k] - before.get(k, 0) for k in now}
        if delta["requests"] == delta["requests_finished"] + delta["requests_aborted"]:
            return delta
        time.sleep(0.1)
    raise AssertionError(f"requests still running on the server: {delta}")


@pytest.fixture(scope="module")
def base_url(smollm2_path):
    with serve_subprocess(smollm2_path) as url:
        yield url


def test_the_node_cuts_converged_samples_in_a_checkpointed_graph(base_url, tiny_games) -> None:
    """Greedy samples agree on their first action, so a K=1 gate fires at step 1: two of three
    are cut, one survivor plays on; the result is in the graph's dict state and its checkpoint."""
    from alfworld_env import load_games

    game = load_games(tiny_games, "train")[0].game_dir
    gate = build_gate("prefix_edit", k=1, tau=0.12)
    graph = gated_graph(GatedSamples(base_url, "smollm2", gate, g=3, loop=GREEDY), InMemorySaver())
    config = {"configurable": {"thread_id": "gated-1"}}
    before = server_counts(base_url)
    out = asyncio.run(graph.ainvoke({"task": str(game)}, config))
    gated = out["gated"]
    assert gated["fired"] and gated["cut_step"] == 1
    assert [s["cut"] for s in gated["samples"]] == [False, True, True]
    # From the server's side: the only requests that ran to their end are the replies the
    # samples played (one per action), so no cut sample's request was generated in full; a cut
    # sample's request in flight was aborted (unless it was cancelled before reaching the server).
    served = settled_counts(base_url, before)
    assert served["requests_finished"] == sum(len(s["actions"]) for s in gated["samples"])
    assert served["generation_tokens"] == gated["tokens_spent"]
    assert served["requests_aborted"] <= sum(s["aborted"] for s in gated["samples"])
    assert not gated["samples"][0]["aborted"]
    assert all(len(s["actions"]) == 1 for s in gated["samples"][1:])  # cut after their first action
    assert len(gated["samples"][0]["actions"]) > 1 or gated["samples"][0]["won"]
    assert gated["tokens_saved_estimate"] > 0 and gated["tokens_spent"] > 0
    assert graph.get_state(config).values["gated"] == gated  # the checkpointer holds it
    json.dumps(gated)  # plain JSON, storable by any checkpointer

    ungated = GatedSamples(base_url, "smollm2", build_gate("none"), g=3, loop=GREEDY)
    full = asyncio.run(ungated({"task": str(game)}))["gated"]
    assert not full["fired"] and full["tokens_spent"] > gated["tokens_spent"]
    assert full["answer"] == gated["answer"]  # greedy: the survivor plays what all would have


@dataclass
class CounterObservation:
    obs: str
    admissible: list[str]
    won: bool = False

    @property
    def done(self) -> bool:
        return self.won


class Counter:
    """A toy environment of our own: count to three by saying 'next'; each sample its own count."""

    def __init__(self) -> None:
        self.count = 0

    async def step(self, command: str) -> CounterObservation:
        self.count += command == "next"
        return CounterObservation(f"The count is {self.count}.", ["next", "wait"], self.count >= 3)

    async def close(self) -> None:
        pass


def counting(task: str) -> EpisodeSource:
    async def open_episode():
        return Counter(), CounterObservation(f"{task} The count is 0.", ["next", "wait"])

    return EpisodeSource("counter", open_episode, "You play a counting game. Reply with one command.")


class Chatter:
    """A free-form toy environment (no admissible list) that never ends: what a sample says is
    its action, so samples drawn with different seeds take different actions."""

    async def step(self, command: str) -> CounterObservation:
        return CounterObservation("Tell me something else.", [])

    async def close(self) -> None:
        pass


def chatting(task: str) -> EpisodeSource:
    async def open_episode():
        return Chatter(), CounterObservation(task, [])

    return EpisodeSource("chatter", open_episode, "Say one short sentence.", action_format="action")


def test_a_divergent_group_runs_to_the_end_under_a_real_gate(base_url) -> None:
    """Sampled free-form replies differ from the first step, so the same prefix-edit gate that
    cuts the converged group above lets this one run: every sample plays every step, none is cut,
    no request is aborted."""
    before = server_counts(base_url)
    node = GatedSamples(
        base_url, "smollm2", build_gate("prefix_edit", k=1, tau=0.12), g=3, loop=SAMPLED, source=chatting
    )
    gated = asyncio.run(node({"task": "Tell me about your day."}))["gated"]
    assert not gated["fired"] and gated["cut_step"] is None
    samples = gated["samples"]
    assert all(len(s["actions"]) == SAMPLED.max_steps and not s["cut"] for s in samples)
    assert len({s["actions"][0] for s in samples}) == 3  # they did diverge at the gate's step
    assert gated["tokens_saved_estimate"] == 0
    served = settled_counts(base_url, before)
    assert served["requests_aborted"] == 0 and served["requests_finished"] == 3 * SAMPLED.max_steps


def test_any_environment_and_any_state_keys(base_url) -> None:
    node = GatedSamples(
        base_url,
        "smollm2",
        build_gate("none"),
        g=2,
        loop=GREEDY,
        source=counting,
        input_key="goal",
        output_key="result",
    )
    out = asyncio.run(gated_graph(node).ainvoke({"goal": "Count to three."}))
    samples = out["result"]["samples"]
    assert len(samples) == 2 and all(1 <= len(s["actions"]) <= 3 for s in samples)
    # each sample counts in its own episode: its win follows its own 'next's alone
    assert all(s["won"] == (s["actions"].count("next") >= 3) for s in samples)
    assert out["result"]["task"] == "counter"


def test_a_state_without_the_task_key_names_it(base_url) -> None:
    node = GatedSamples(base_url, "smollm2", build_gate("none"), g=2, loop=GREEDY)
    with pytest.raises(KeyError, match=r"state\['task'\]; the state has \['game'\]"):
        asyncio.run(node({"game": "x"}))


def test_the_docs_example_runs_as_pasted(base_url, tmp_path, capsys, monkeypatch) -> None:
    """docs/langgraph.md's example, with only the server address and the games folder swapped,
    run as a module of its own (LangGraph resolves the state's type hints in its module)."""
    import sys
    import types
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "langgraph.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 40
    code = code.replace("http://127.0.0.1:8000/v1", base_url).replace("data/games/tiny", str(tmp_path))
    module = types.ModuleType("docs_example")
    monkeypatch.setitem(sys.modules, "docs_example", module)
    exec(compile(code, "docs/langgraph.md", "exec"), module.__dict__)
    answer, fired, *_ = capsys.readouterr().out.split()
    assert answer in ("True", "False") and fired in ("True", "False")
