"""The LangGraph node over a real local server (SmolLM2 over HTTP, loopback) and real games."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from selective_rollout.gate import build_gate
from selective_rollout.integrations.agent_loop import EpisodeSource, LoopConfig
from selective_rollout.integrations.langgraph import GatedSamples, gated_graph
from selective_rollout.integrations.serve import serve_subprocess

GREEDY = LoopConfig(model="smollm2", max_steps=3, max_tokens=16, temperature=0.0)


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
    out = asyncio.run(graph.ainvoke({"task": str(game)}, config))
    gated = out["gated"]
    assert gated["fired"] and gated["cut_step"] == 1
    assert [s["cut"] for s in gated["samples"]] == [False, True, True]
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
