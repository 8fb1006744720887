"""The one interface the coordinator drives every rollout engine through.

The coordinator awaits ``generate`` on Ray actors and never looks behind it, so a back-end is
one file implementing ``RolloutEngine`` (with a ``Params`` model of its own parameters) plus a
registry entry (engines/__init__.py). Types are plain dataclasses so they cross Ray without custom
serialisers.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from selective_rollout.config.engine import MAX_TEMPERATURE, MIN_TEMPERATURE
from selective_rollout.registry import Registry
from selective_rollout.rollout.engines.params import BackendParams

if TYPE_CHECKING:
    import torch

    from selective_rollout.weight_sync.collective import TensorSpec

FinishReason = Literal["stop", "length", "abort"]

# every back-end by name (lines of selective_rollout.plugins, entry points of the group
# "selective_rollout.engines", or a class named by its path); ``requires`` in an entry's line names
# the library it imports at run time, checked before Ray starts
BACKENDS: Registry = Registry(
    "back-end",
    "selective_rollout.engines",
    base=f"{__name__}:RolloutEngine",
    params_base="selective_rollout.rollout.engines.params:BackendParams",
    catalog="selective_rollout.plugins:BACKEND_CATALOG",
)
MAX_SEED = 2**63  # one below what torch.Generator.manual_seed accepts, leaving room for seed + n


class EngineError(RuntimeError):
    """A request an engine cannot serve; the message names the request and the reason."""


@dataclass
class SamplingParams:
    """Per-request sampling; ``choices`` restricts the reply to exactly one of these strings.

    A choice is followed by the end-of-turn token, so ``go to cabinet 1`` can never be a
    truncated ``go to cabinet 10``. ``stop``: an unconstrained reply ends with the token that
    completes the first of these strings, which stays in its ids and text (the learner trains
    on the ids the policy sampled; an environment that parses ``</answer>`` sees it).
    """

    n: int = 1
    max_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    choices: list[str] | None = None
    stop: list[str] | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field; engines call this before queueing.

        Checked here, once for every back-end, because a value the sampler cannot use (a NaN or
        denormal temperature, a seed the generator rejects) would otherwise fail inside a
        batched step, next to other requests.
        """
        if not _whole(self.n) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an integer >= 1, got {self.n!r}")
        if not _whole(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or not (
            self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE
        ):
            raise ValueError(
                "SamplingParams.temperature must be 0 (greedy) or in "
                f"[{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {self.temperature!r}"
            )
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _whole(self.seed) or not 0 <= self.seed < MAX_SEED):
            raise ValueError(f"SamplingParams.seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.choices is not None and (not self.choices or any(not c for c in self.choices)):
            raise ValueError("SamplingParams.choices must be a non-empty list of non-empty strings")
        if self.stop is not None and any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be a list of non-empty strings, got {self.stop!r}")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class CompletionOutput:
    """One sampled reply. ``logprobs[i]`` is the model's untempered log-prob of ``token_ids[i]``.

    ``token_ids`` include the end-of-turn token when ``finish_reason == "stop"``: the learner
    trains on exactly these ids. ``versions[i]`` is the policy version of the oldest weights the
    distribution that chose ``token_ids[i]`` depends on: those that computed its logits, or older
    ones whose KV they attended to. Weights may reach an engine while a reply is decoded, so one
    reply can span two versions where the engine recomputes the KV (vLLM) and keeps the version
    of its start where it keeps the KV (transformers). Empty where the back-end does not know.
    """

    index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    versions: list[int] = field(default_factory=list)


@dataclass
class Completion:
    request_id: str
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens served from a KV cache instead of prefilled
    outputs: list[CompletionOutput]


@dataclass(frozen=True)
class TextDelta:
    """A piece of one output's text as it is decoded (streaming): the text added since the last
    delta of output ``index``, and its finish reason on the output's last delta."""

    index: int
    text: str
    finish_reason: FinishReason | None = None


class BusyClock:
    """Seconds during which at least one request was in flight: the time the engine had work
    queued, one definition for every back-end, so a bench can say whether a coordinator keeps
    its engines fed (``busy_s`` in ``health()``; its share of a wall-clock interval is the busy
    fraction)."""

    def __init__(self) -> None:
        self._open = 0
        self._since = 0.0
        self._total = 0.0

    def enter(self) -> None:
        if self._open == 0:
            self._since = time.monotonic()
        self._open += 1

    def leave(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._total += time.monotonic() - self._since

    @property
    def busy_s(self) -> float:
        return self._total + (time.monotonic() - self._since if self._open else 0.0)


class RolloutEngine(ABC):
    """An async generation server for one model replica (one GPU, or a share of the CPUs).

    The core every back-end implements: ``generate``, ``abort``, ``health`` and ``shutdown``.
    Anything more is a capability, a mixin the back-end adds and the driver checks for before it
    relies on it (``missing_capabilities``): ``WeightSync`` (a training run's weights reach the
    engine), ``LogprobProbe`` (the served-weights check after every sync), ``CacheControl`` (a
    benchmark's arms start cold). ``Params`` declares the back-end's own parameters; an engine
    reads them with ``cfg.params_for(self.Params)``.
    """

    Params: ClassVar[type[BackendParams]] = BackendParams

    @abstractmethod
    async def generate(
        self,
        request_id: str,
        prompt: list[int] | list[dict],
        sampling: SamplingParams,
        session_id: str | None = None,
    ) -> Completion:
        """Sample ``sampling.n`` replies to ``prompt`` (token ids or chat messages).

        ``session_id`` names a trajectory: the engine may keep its KV cache across turns so
        that the next turn, whose prompt extends this one, prefills only the new suffix.
        """

    @abstractmethod
    async def abort(self, request_ids: list[str]) -> None:
        """End these requests now; their ``generate`` returns with ``finish_reason="abort"``."""

    async def release(self, session_ids: list[str]) -> None:
        """Drop the cached KV of trajectories that finished or were cut (a back-end that keeps no
        session KV has nothing to drop)."""
        del session_ids

    @abstractmethod
    async def health(self) -> dict[str, Any]:
        """Liveness and load figures for the coordinator and system metrics."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Abort everything in flight and free the model."""

    async def capabilities(self) -> list[str]:
        """The capabilities this back-end has, by name (``CAPABILITIES``): asked of a running
        engine actor, since the driver's own environment may lack the back-end's library."""
        return capabilities_of(type(self))

    async def location(self) -> dict[str, Any]:
        """This engine's Ray node and process (``placement.json``)."""
        from selective_rollout.process_memory import here

        return here()

    async def resident_gb(self) -> float:
        """Resident memory of this engine's process (``system/rss_gb/engine_*``)."""
        from selective_rollout.process_memory import resident_gb

        return resident_gb()


class WeightSync(ABC):
    """Capability: the learner's weights reach the engine, by broadcast over the sync group
    (``init_weight_sync`` then ``receive_weights``) or by value (``load_weights``).

    Weights may arrive while requests are in flight: the engine holds them between two decode
    steps, loads, and lets them go on under the new weights, so an update never waits for the
    slowest reply. ``version`` is the policy version of the weights sent; a token whose
    distribution depends on them alone carries it (``CompletionOutput.versions``). What an
    in-flight reply keeps of the old weights is the back-end's to say (its docstring): the
    transformers engine keeps the reply's KV (computed by the old weights), vLLM recomputes it
    under the new ones.
    """

    @abstractmethod
    async def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        """Join the learner's weight-sync group (``weight_sync.collective``) at ``rank``: the first
        of ``sync_workers()`` consecutive ranks, one per worker process."""

    async def sync_workers(self) -> int:
        """How many processes of this engine join the weight-sync group (its tensor-parallel size)."""
        return 1

    @abstractmethod
    async def receive_weights(self, specs: list[TensorSpec], version: int) -> None:
        """Receive one broadcast per spec, in order, and load each under its HF name; the weights
        are policy version ``version``."""

    @abstractmethod
    async def load_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        """Load full weights passed by value (Ray object store): the no-process-group fallback;
        the weights are policy version ``version``."""

    @abstractmethod
    async def weights_checksum(self) -> float:
        """Sum over parameters of their float64 sums, so tests can see a weight update land."""


class LogprobProbe(ABC):
    """Capability: the served model scores a fixed probe."""

    @abstractmethod
    async def score(self, token_ids: list[int]) -> list[float]:
        """The served model's log-prob of every token after the first, teacher-forced (no
        sampling, no cache): after a weight sync the driver compares it with the learner's on a
        fixed probe (``weight_sync.served``) to prove the engine serves the weights it was sent."""


class CacheControl(ABC):
    """Capability: the engine forgets what it cached."""

    @abstractmethod
    async def reset_cache(self) -> None:
        """Forget every cached prompt (session KV, prefix cache), so that what runs next pays its
        full prefill, as a cold server would: a benchmark's arms each start alike."""


CAPABILITIES: dict[str, type] = {
    "weight sync": WeightSync,
    "log-prob probe": LogprobProbe,
    "cache control": CacheControl,
}
# what a training run relies on: its updates reach the engines, and the served weights are checked
TRAINING_NEEDS = ("weight sync", "log-prob probe")


def capabilities_of(cls: type) -> list[str]:
    """The names of the capabilities ``cls`` has (in ``CAPABILITIES``' order)."""
    return [name for name, mixin in CAPABILITIES.items() if issubclass(cls, mixin)]


def missing_capabilities(have: list[str], needed: tuple[str, ...], backend: str, purpose: str) -> str | None:
    """One line naming what back-end ``backend`` lacks of ``needed`` for ``purpose``, else None."""
    lacking = [name for name in needed if name not in have]
    if not lacking:
        return None
    mixins = ", ".join(f"{name} ({CAPABILITIES[name].__name__})" for name in lacking)
    return (
        f"engine.backend={backend} lacks {mixins}, which {purpose} needs; its back-end has "
        f"{', '.join(have) or 'only the core (generate, abort, health, shutdown)'} "
        "(selective_rollout/rollout/engines/base.py)"
    )
