"""Result objects of the offline API, shaped like vLLM's `RequestOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class SpecMetrics:
    """Per-request speculative counters."""

    num_rounds: int = 0  # decode rounds (each emits >= 1 token)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # tokens emitted by decode rounds (the prefill's first token excluded)
    # Diffusion LMs: num_rounds counts model calls, num_emitted_tokens finalized tokens, and this the
    # static steps they advanced (FreeDave: several a call; static decoding: one)
    num_diffusion_steps: int = 0

    @property
    def acceptance_length(self) -> float:
        """tau: tokens emitted per round."""
        return self.num_emitted_tokens / self.num_rounds if self.num_rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def add_round(self, num_draft_tokens: int, num_accepted_tokens: int, num_emitted_tokens: int) -> None:
        """Count one decode round."""
        self.num_rounds += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        self.num_emitted_tokens += num_emitted_tokens

    @classmethod
    def total(cls, parts) -> "SpecMetrics":
        """The counters of several sequences (a request's choices) added up."""
        return cls(*(sum(getattr(m, f.name) for m in parts) for f in fields(cls)))


def most_likely(logprobs: dict[int, float], n: int) -> list[tuple[int, float]]:
    """The n most likely tokens of one position's logprobs (the top n and the drawn token, as the
    target worker gives them): the drawn token is among them only where it ranks there. Most likely
    first, ties by token id."""
    return sorted(logprobs.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | None while running
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
