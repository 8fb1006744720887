"""The chat server's counters, exposed at ``GET /metrics`` in Prometheus' text format.

A gated client cuts samples by closing their connections; these counters are how an operator (and
the tests) see from the server's side that the cut requests were really aborted and what was
generated, the same way ``vllm serve`` exposes ``vllm:request_success_total`` and its token
counters. Each server has its own registry, so several servers in one process never share counts.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

PREFIX = "selective_rollout"


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"{PREFIX}_requests", "Chat completion requests admitted to the engine", registry=self.registry
        )
        self.finished = Counter(
            f"{PREFIX}_requests_finished", "Requests whose generation ran to its end", registry=self.registry
        )
        self.aborted_requests = Counter(
            f"{PREFIX}_requests_aborted",
            "Requests aborted in the engine because the client went away (a gated cut)",
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens of finished requests", registry=self.registry
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Tokens generated for finished requests", registry=self.registry
        )

    @property
    def aborted(self) -> int:
        return int(self.registry.get_sample_value(f"{PREFIX}_requests_aborted_total") or 0)

    def completed(self, usage: dict[str, int]) -> None:
        """A request generated to its end, with its OpenAI ``usage``."""
        self.finished.inc()
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.generation_tokens.inc(usage["completion_tokens"])

    def exposition(self) -> tuple[bytes, str]:
        """The text of ``/metrics`` and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
