"""A request in flight on the transformers engine, and each of its sampled outputs.

The scheduler, the batch builder and the sampler all read and advance this state; keeping it in
a module of its own lets each of them import it without importing the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from selective_rollout.rollout.engines.base import Completion, CompletionOutput, SamplingParams
from selective_rollout.rollout.engines.trie import ChoiceTrie


@dataclass(eq=False)
class Request:
    """One ``generate`` call from its arrival until its future is answered: the prompt, the
    constraint and the outputs (``seqs``, made at admission)."""

    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: asyncio.Future
    trie: ChoiceTrie | None
    # called from the engine's worker thread with (output index, token) as each token is sampled
    on_token: Callable[[int, int], None] | None = None
    aborted: bool = False
    cached_prompt_tokens: int = 0
    seqs: list[Seq] = field(default_factory=list)

    def completion(self, tokenizer: Any) -> Completion:
        # an output aborted before its forced tokens were scored ends at its last scored token
        outputs = [
            CompletionOutput(
                index=s.index,
                token_ids=s.tokens[: len(s.logprobs)],
                logprobs=list(s.logprobs),
                text=tokenizer.decode(s.tokens[: len(s.logprobs)], skip_special_tokens=True),
                finish_reason=s.finish_reason or "abort",
                versions=[s.version] * len(s.logprobs),
            )
            for s in self.seqs
        ]
        return Completion(self.request_id, len(self.prompt), self.cached_prompt_tokens, outputs)


@dataclass(eq=False)
class Seq:
    """One sampled output while it decodes.

    The KV cache holds ``tokens[:fed]``; the rest is fed by the next decode forwards. The
    log-probs of ``tokens[:fed + 1]`` are known: a token's log-prob comes from the logits at the
    position before it, so the tokens a constrained choice forced (``Sampler._force``) get theirs
    when the forward that feeds them runs."""

    req: Request
    index: int
    generator: torch.Generator
    trie: ChoiceTrie | None
    # the policy version of the weights at admission: the output's KV, and so every token it
    # samples, depends on them even after newer weights load mid-reply (the KV is kept)
    version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    fed: int = 0

    def decided(self) -> str | None:
        """How a constrained output ends once its tokens are scored: "stop" when its choice is
        complete, "length" at ``max_tokens``, None while it goes on (an unconstrained output
        finishes as it samples, with nothing left to score)."""
        if self.trie is None:
            return None
        if self.trie.done:
            return "stop"
        return "length" if len(self.tokens) >= self.req.sampling.max_tokens else None

    def to_feed(self, limit: int) -> list[int]:
        """The next at most ``limit`` tokens for the KV cache: up to the last one, whose logits
        choose what follows; a decided output stops before its last token (nothing follows it)."""
        end = len(self.tokens) - (1 if self.decided() else 0)
        return self.tokens[self.fed : min(end, self.fed + limit)]

    def scored(self, logprob: float) -> None:
        """Record the log-prob of the next unscored token and stream that token: a stream carries
        only scored tokens, so what an aborted output streamed is what its completion holds."""
        self.logprobs.append(logprob)
        if self.req.on_token is not None:
            self.req.on_token(self.index, self.tokens[len(self.logprobs) - 1])
