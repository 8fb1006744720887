"""G samples of one agent task against any OpenAI-compatible chat endpoint, watched by a gate.

The loop the inference-time gate (``integrations.infer``) and the LangGraph node
(``integrations.langgraph``) share. Each sample has its own conversation and its own environment
episode (never one message list for all G); after every environment step its whole action goes to
a ``LiveGroup``, so the gate compares actions, not strings of text. Requests go through the
``openai`` back-end's ``OpenAIClient`` (the package's one speaker of the protocol; an unreachable
server or an error status is an ``EngineError`` naming the URL). When the gate fires, the
samples it cuts have their in-flight request cancelled (the HTTP connection closes, which aborts
the generation in this package's server and in ``vllm serve``) and ``survivors`` of them run to the end.

An environment is anything an ``EpisodeSource`` can open: an episode with async ``step`` and
``close`` whose observations have ``obs`` (text), ``admissible`` (commands, [] if free-form),
``won`` and ``done``, the system prompt to play it with, and where a reply's action is (after
``Action:``, ReAct, or its first line). With an admissible list a reply's action is matched to one
of its commands; without one (a free-form environment) the action is the reply's text as is
(``rollout.actions``). An observation with chat ``messages`` (the first one: the environment's own
opening, system prompt included) is sent as those messages. ``environment_task`` is the source for
a task of any registered environment, ``alfworld_game`` for an ALFWorld game folder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import httpx

from selective_rollout.envs import ENVS
from selective_rollout.envs.base import Environment, Message, folder_task, messages_of
from selective_rollout.gate import Gate
from selective_rollout.integrations.episodes import ThreadedEpisode
from selective_rollout.integrations.live_group import LiveGroup
from selective_rollout.records import Task
from selective_rollout.rollout.actions import parse_action
from selective_rollout.rollout.engines.base import SamplingParams
from selective_rollout.rollout.engines.openai_engine import Answer, OpenAIClient
from selective_rollout.rollout.prompts import system_prompt, user_text


class AgentObservation(Protocol):
    obs: str
    admissible: list[str]
    won: bool

    @property
    def done(self) -> bool: ...


class AgentEpisode(Protocol):
    async def step(self, command: str) -> AgentObservation: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EpisodeSource:
    """How to start one sample's episode of the task (called G times), and the system prompt."""

    name: str
    open: Callable[[], Awaitable[tuple[AgentEpisode, AgentObservation]]]
    system_prompt: str
    action_format: Literal["react", "action"] = "react"
    stop: tuple[str, ...] = ()  # the environment's stop strings (``Environment.stop_strings``)


def environment_task(
    environment: Environment, task: Task, action_format: Literal["react", "action"] = "react"
) -> EpisodeSource:
    """A task of any environment (``ENVS.build(name, params)``) as an episode source, worded by
    the environment's prompt unless its first observation brings its own messages."""
    return EpisodeSource(
        task.task_id,
        lambda: ThreadedEpisode.open_task(environment, task),
        system_prompt(action_format, environment.prompt),
        action_format,
        tuple(environment.stop_strings()),
    )


def alfworld_game(game_dir: str | Path) -> EpisodeSource:
    """An ALFWorld game folder (``alfworld_env``'s layout) as an episode source."""
    return environment_task(ENVS.build("alfworld"), folder_task(str(game_dir), str(game_dir), ""))


@dataclass
class SampleResult:
    actions: list[str] = field(default_factory=list)
    won: bool = False
    cut: bool = False
    completion_tokens: int = 0
    prompt_tokens: int = 0
    aborted: bool = False  # cut with a request in flight, which was cancelled (aborted upstream)


@dataclass
class GroupResult:
    game: str
    samples: list[SampleResult]
    fired: bool
    cut_step: int | None
    reason: str

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.samples)

    @property
    def requests_aborted(self) -> int:
        return sum(s.aborted for s in self.samples)

    @property
    def answer(self) -> bool:
        """Best-of-N success over the samples that ran to the end (the survivor, when cut)."""
        return any(s.won for s in self.samples if not s.cut)

    @property
    def tokens_saved_estimate(self) -> int:
        """Completion tokens the cut samples would still have spent, estimated: each cut sample,
        at its own mean tokens per reply so far, for as many more replies as the longest survivor
        took after the cut. An estimate (nobody ran them), which is why it is named so."""
        if self.cut_step is None:
            return 0
        more = max((len(s.actions) - self.cut_step for s in self.samples if not s.cut), default=0)
        per_reply = [s.completion_tokens / len(s.actions) for s in self.samples if s.cut and s.actions]
        return round(sum(per_reply) * max(more, 0))


@dataclass
class LoopConfig:
    model: str
    max_steps: int = 10
    max_tokens: int = 48
    temperature: float = 1.0
    seed: int = 0
    fuzzy_threshold: float = 0.85
    stop: tuple[str, ...] = ()  # stop strings of every request, besides the environment's


async def _reply(
    client: OpenAIClient, cfg: LoopConfig, messages: list[dict], seed: int, stop: tuple[str, ...] = ()
) -> Answer:
    """One reply to ``messages``; the stop strings of the loop and of the environment, each once."""
    stops = list(dict.fromkeys([*cfg.stop, *stop])) or None
    sampling = SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed, stop=stops)
    return await client.generate(f"sample-seed-{seed}", messages, sampling, cfg.model)


def _user_turn(ob: AgentObservation) -> list[Message]:
    """An observation as chat messages: its own, or the project's wording of its text."""
    own = messages_of(ob)
    return own if own is not None else [{"role": "user", "content": user_text(ob.obs, ob.admissible)}]


async def _sample(
    client: OpenAIClient, cfg: LoopConfig, group: LiveGroup, i: int, source: EpisodeSource
) -> SampleResult:
    res = SampleResult()
    episode, ob = await source.open()
    opening = messages_of(ob)
    messages = opening if opening is not None else [{"role": "system", "content": source.system_prompt}]
    try:
        for step in range(cfg.max_steps):
            if step or opening is None:
                messages += _user_turn(ob)
            answer = await group.unless_cut(
                i, _reply(client, cfg, messages, cfg.seed * 100_003 + 1000 * i + step, source.stop)
            )
            if answer is None:
                break
            res.completion_tokens += answer.completion_tokens
            res.prompt_tokens += answer.completion.prompt_tokens
            text = answer.completion.outputs[0].text
            messages.append({"role": "assistant", "content": text})
            command = parse_action(text, ob.admissible, source.action_format, cfg.fuzzy_threshold).command
            ob = await episode.step(command)
            res.actions.append(command)
            res.won = ob.won
            group.record(i, command)
            if ob.done or group.cut[i]:
                break
    finally:
        group.end(i)
        await episode.close()
    res.cut, res.aborted = group.cut[i], group.aborted[i]
    return res


async def run_group(
    client: OpenAIClient | httpx.AsyncClient,
    cfg: LoopConfig,
    source: EpisodeSource,
    g: int,
    gate: Gate,
    survivors: int = 1,
) -> GroupResult:
    """Run G samples of one task concurrently; when the gate fires, all but ``survivors`` are cut.
    ``client``: the shared ``OpenAIClient``, or an httpx client whose base URL is the server's root."""
    if isinstance(client, httpx.AsyncClient):
        client = OpenAIClient(http=client)
    group = LiveGroup(gate, g, survivors)
    samples = await asyncio.gather(*[_sample(client, cfg, group, i, source) for i in range(g)])
    reason = group.decision.reason if group.decision else "not fired"
    return GroupResult(source.name, list(samples), group.fired, group.cut_step, reason)
