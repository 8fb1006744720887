"""Selective Rollout inside OpenRLHF (``openrlhf==0.11.2``): a gated multi-turn agent executor.

OpenRLHF runs the n samples of a prompt as n concurrent ``AgentExecutor.execute`` calls in one
event loop (``RolloutRayActor.generate_responses``), each unaware of the others. This executor
joins the n calls into a ``LiveGroup`` (the first n calls for the same prompt and label: they
are created together by one ``asyncio.gather``), records each environment action, asks the gate,
and when it fires cancels every sample's pending ``llm_engine.generate`` (vLLM aborts a request
whose generator is cancelled) and ends each sample at once.

A cut group is returned *marked*, in the form OpenRLHF's ``SamplesGenerator`` already handles:
every sample gets ``reward == scores == cut_score`` (default 0.0), so with
``--algo.dynamic_filtering_enable`` (range (0, 1)) the group's mean score falls outside the range,
the group is dropped and a replacement prompt is dispatched; without filtering its GRPO
advantages are all zero. ``extra_logs`` carry ``sr_gate_cut`` and ``sr_gate_step``.

The environment action of a step is ``step_result["action"]`` when the agent instance returns
it (the ALFWorld instance does), else the text after the last ``Action:`` of the reply.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from selective_rollout.gate import Gate
from selective_rollout.integrations.live_group import LiveGroup
from selective_rollout.rollout.actions import extract_action, normalise

try:
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor
except ImportError as exc:  # a clear line instead of a deep traceback
    raise ImportError(
        "selective_rollout.integrations.openrlhf needs OpenRLHF: pip install 'openrlhf==0.11.2' "
        f"(on CPU: --no-deps plus its pure-python deps; see docs/openrlhf.md): {exc}"
    ) from exc


@dataclass
class _Member:
    group: LiveGroup
    index: int
    tokenizer: Any
    last_token_ids: list[int] = field(default_factory=list)


_MEMBER: contextvars.ContextVar[_Member] = contextvars.ContextVar("selective_rollout_member")


def _current() -> _Member:
    try:
        return _MEMBER.get()
    except LookupError:
        raise RuntimeError("no sample is executing: call this inside SelectiveRolloutExecutor") from None


def current_tokenizer() -> Any:
    """The HF tokenizer of the sample being executed, for agent instances that render prompts."""
    return _current().tokenizer


def current_reply_token_ids() -> list[int]:
    """Token ids of the sample's last reply: vLLM's text omits the stop token, these do not, so an
    instance can tell whether the reply closed its turn."""
    return list(_current().last_token_ids)


@dataclass
class _AbortedOutput:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "abort"
    logprobs: list[Any] = field(default_factory=list)


@dataclass
class _AbortedRequestOutput:
    """What a cut sample's generate returns: an empty reply, shaped like vLLM's RequestOutput."""

    outputs: list[_AbortedOutput] = field(default_factory=lambda: [_AbortedOutput()])


class _GatedEngine:
    """Wraps OpenRLHF's ``llm_engine`` for one sample: generation is cancelled when the sample is cut."""

    def __init__(self, engine: Any, member: _Member) -> None:
        self._engine, self._member = engine, member

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, **kwargs: Any) -> Any:
        m = self._member
        work = self._engine.generate(prompt_token_ids, sampling_params, **kwargs)
        out = await m.group.unless_cut(m.index, work)
        out = _AbortedRequestOutput() if out is None else out
        m.last_token_ids = list(out.outputs[0].token_ids)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def default_action(step_result: dict, states: dict) -> str:
    """The environment action of a step: the instance's ``action``, else the reply's Action line."""
    action = step_result.get("action")
    if isinstance(action, str):
        return action
    return normalise(extract_action(states.get("action_text", ""), "react"))


def _gated_instance_class(inner_cls: type, action_of: Callable[[dict, dict], str]) -> type:
    """An AgentInstance that reports every action of the wrapped instance to the sample's group."""

    class GatedInstance(AgentInstanceBase):
        def __init__(self) -> None:
            self._inner = inner_cls()
            self._member = _MEMBER.get()

        async def reset(self, states: dict, **kwargs: Any) -> dict:
            return await self._inner.reset(states, **kwargs)

        async def step(self, state_dict: dict, **kwargs: Any) -> dict:
            import torch

            m = self._member
            if m.group.cut[m.index]:  # cut while generating: the env is not stepped again
                return {"rewards": torch.tensor(0.0), "environment_feedback": "", "done": True}
            result = await self._inner.step(state_dict, **kwargs)
            m.group.record(m.index, action_of(result, state_dict))
            if result["done"]:
                m.group.end(m.index)
            elif m.group.cut[m.index]:
                result = {**result, "done": True}
            return result

    GatedInstance.__name__ = f"Gated{inner_cls.__name__}"
    return GatedInstance


class SelectiveRolloutExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor with the group gate; use as ``AgentExecutor`` in an agent file.

    ``n_samples_per_prompt`` must equal OpenRLHF's ``--rollout.n_samples_per_prompt``.
    """

    def __init__(
        self,
        agent_instance_cls: type,
        gate: Gate,
        n_samples_per_prompt: int,
        cut_score: float = 0.0,
        action_of: Callable[[dict, dict], str] = default_action,
    ) -> None:
        if not (isinstance(agent_instance_cls, type) and issubclass(agent_instance_cls, AgentInstanceBase)):
            raise TypeError(f"agent_instance_cls must subclass AgentInstanceBase, got {agent_instance_cls!r}")
        if n_samples_per_prompt < 2:
            raise ValueError(
                f"the gate compares samples: n_samples_per_prompt must be >= 2, got {n_samples_per_prompt}"
            )
        super().__init__(_gated_instance_class(agent_instance_cls, action_of))
        self.gate, self.n, self.cut_score = gate, n_samples_per_prompt, cut_score
        self._forming: dict[tuple[str, str], tuple[LiveGroup, int]] = {}
        self.groups_started = 0
        self.groups_cut = 0

    def _join(self, prompt: Any, label: Any) -> tuple[LiveGroup, int]:
        """Seat this call in the group forming for its prompt; runs before any await, so the
        n calls of one ``generate_responses`` take seats 0..n-1 of one group."""
        key = (str(prompt), str(label))
        group, seated = self._forming.pop(key, (None, 0))
        if group is None:
            group = LiveGroup(self.gate, self.n)
            self.groups_started += 1
        if seated + 1 < self.n:
            self._forming[key] = (group, seated + 1)
        return group, seated

    async def execute(
        self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
    ) -> dict:
        group, index = self._join(prompt, label)
        member = _Member(group, index, hf_tokenizer)
        token = _MEMBER.set(member)
        engine = _GatedEngine(llm_engine, member)
        try:
            response = await super().execute(
                prompt, label, sampling_params, max_length, hf_tokenizer, engine, images
            )
        finally:
            _MEMBER.reset(token)
            group.end(index)
        cut = group.cut[index]
        if cut:
            response["reward"] = response["scores"] = self.cut_score
            if index == 0:
                self.groups_cut += 1
        response["extra_logs"] = {
            **(response.get("extra_logs") or {}),
            "sr_gate_cut": float(cut),
            "sr_gate_step": float(group.cut_step or 0),
        }
        return response
