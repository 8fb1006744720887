"""The gate as a LangGraph node: G agent samples of one task, cut once they agree, one survivor.

``GatedSamples`` is a node for any ``StateGraph`` whose state is a dict (LangGraph hands nodes
the state as a dict and merges the dict they return): it reads the task from
``state[input_key]``, runs G samples against an OpenAI-compatible endpoint (ours, or
``vllm serve``) through ``integrations.agent_loop`` (each sample with its own conversation and
environment episode, the gate asked on whole actions after every step, the requests of cut
samples aborted, ``survivors`` running to the end, as best-of-N or self-consistency) and writes a
``GatedResult`` under ``state[output_key]``. The result is plain JSON (lists, numbers, strings),
so every LangGraph checkpointer can store it. ``gated_graph`` builds the one-node graph.

    node = GatedSamples("http://127.0.0.1:8000/v1", "smollm2", build_gate("prefix_edit", k=3, tau=0.12))
    graph = gated_graph(node, checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "1"}}
    out = await graph.ainvoke({"task": "data/games/tiny/valid_seen/0003"}, thread)
    out["gated"]["answer"], out["gated"]["tokens_spent"]

``langgraph`` is needed only by ``gated_graph`` (``pip install 'selective-rollout[langgraph]'``);
the node itself is a plain async callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import httpx

from selective_rollout.gate import Gate
from selective_rollout.integrations.agent_loop import (
    EpisodeSource,
    GroupResult,
    LoopConfig,
    alfworld_game,
    run_group,
)


class SampleSummary(TypedDict):
    actions: list[str]
    won: bool
    cut: bool
    aborted: bool  # cut while its request was in flight: the request was aborted
    completion_tokens: int


class GatedResult(TypedDict):
    """What the node writes: the group's answer (did a sample that ran to the end succeed), each
    sample's actions, whether and at which step the gate cut, and the tokens spent and saved."""

    task: str
    answer: bool
    fired: bool
    cut_step: int | None
    reason: str
    samples: list[SampleSummary]
    tokens_spent: int
    tokens_saved_estimate: int


def as_state(result: GroupResult) -> GatedResult:
    """A finished group as plain JSON for the graph state."""
    return GatedResult(
        task=result.game,
        answer=result.answer,
        fired=result.fired,
        cut_step=result.cut_step,
        reason=result.reason,
        samples=[
            SampleSummary(
                actions=list(s.actions),
                won=s.won,
                cut=s.cut,
                aborted=s.aborted,
                completion_tokens=s.completion_tokens,
            )
            for s in result.samples
        ],
        tokens_spent=result.completion_tokens,
        tokens_saved_estimate=result.tokens_saved_estimate,
    )


class GatedSamples:
    """A LangGraph node running G gated agent samples of ``state[input_key]``.

    ``source`` turns the state's task value into an ``EpisodeSource`` (default: an ALFWorld game
    folder); ``gate`` is any registered gate (``gate.build_gate``); ``survivors`` samples run on
    after a cut (1: best-of-N keeps one; G-1 or more would make the gate pointless).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        gate: Gate,
        g: int = 4,
        survivors: int = 1,
        loop: LoopConfig | None = None,
        source: Callable[[Any], EpisodeSource] = alfworld_game,
        input_key: str = "task",
        output_key: str = "gated",
        timeout_s: float = 600.0,
    ) -> None:
        self.base_url, self.gate, self.g, self.survivors = base_url.rstrip("/") + "/", gate, g, survivors
        self.loop = loop or LoopConfig(model=model)
        if self.loop.model != model:
            raise ValueError(f"model {model!r} differs from loop.model {self.loop.model!r}")
        self.source, self.input_key, self.output_key = source, input_key, output_key
        self.timeout_s = timeout_s

    async def __call__(self, state: Mapping[str, Any]) -> dict[str, GatedResult]:
        if self.input_key not in state:
            raise KeyError(
                f"GatedSamples reads the task from state[{self.input_key!r}]; the state has {sorted(state)}"
            )
        source = self.source(state[self.input_key])
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s) as client:
            result = await run_group(client, self.loop, source, self.g, self.gate, self.survivors)
        return {self.output_key: as_state(result)}


def gated_graph(node: GatedSamples, checkpointer: Any = None) -> Any:
    """START -> the node -> END, compiled (with ``checkpointer`` if given)."""
    from langgraph.graph import END, START, StateGraph

    state = TypedDict("GatedState", {node.input_key: Any, node.output_key: GatedResult}, total=False)
    graph = StateGraph(state)
    graph.add_node("gated_samples", node)
    graph.add_edge(START, "gated_samples")
    graph.add_edge("gated_samples", END)
    return graph.compile(checkpointer=checkpointer)
