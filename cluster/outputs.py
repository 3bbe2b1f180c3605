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


class Logprob(float):
    """One token's log-probability in the Python API's outputs, shaped like vLLM's `Logprob`
    (`.logprob`, `.rank`: its rank in the vocabulary, 1 for the most likely; `.decoded_token`); still
    a float for code written against specray's plain `dict[int, float]`."""

    rank: int | None
    decoded_token: str | None

    def __new__(cls, logprob: float, rank: int | None = None, decoded_token: str | None = None) -> "Logprob":
        obj = super().__new__(cls, logprob)
        obj.rank, obj.decoded_token = rank, decoded_token
        return obj

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"

    def __reduce__(self):
        return Logprob, (float(self), self.rank, self.decoded_token)


def ranked(logprobs: dict[int, float], n: int, decode) -> dict[int, Logprob]:
    """One position's logprobs (the top n and the drawn token) as `Logprob`s, most likely first;
    `decode(token_id)` gives each one's text (None: no tokenizer). The top n rank by their place
    among themselves; the drawn (or prompt) token, where it is not one of them, takes the worker's
    rank (kernels/proposal.py PositionLogprobs), as vLLM's: a drawn token tied with the n-th no
    longer pushes a top-n token out of its rank."""
    order = most_likely(logprobs, len(logprobs))
    own, own_rank = getattr(logprobs, "token", None), getattr(logprobs, "rank", None)
    top = [t for t, _ in order if t != own] if len(logprobs) > n else [t for t, _ in order]
    ranks = {t: i + 1 for i, t in enumerate(top[:n])}
    if own is not None and own not in ranks:
        ranks[own] = own_rank
    return {t: Logprob(lp, ranks.get(t), decode(t)) for t, lp in order}


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | None while running
    stop_reason: int | str | None = None
    # one dict a generated token; the Python API gives `Logprob`s (vLLM's shape), the servers floats
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then a dict for each
    prompt_logprobs: list[dict[int, float] | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache, not computed (the most of its choices)


class PublicLogprobs:
    """The Python API's outputs carry `Logprob`s: each request's are converted once a token (its
    outputs are cumulative, one a round), and forgotten when it ends."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.top_n: dict[str, tuple[int | None, int | None]] = {}  # request id -> (logprobs, prompt_logprobs)
        self.converted: dict[tuple[str, int], list] = {}  # (request id, choice; -1: the prompt) -> so far
        self.texts: dict[int, str] = {}

    def track(self, request_id: str, n: int | None, prompt_n: int | None = None) -> None:
        if n is not None or prompt_n is not None:
            self.top_n[request_id] = (n, prompt_n)

    def forget(self, request_id: str) -> None:
        if self.top_n.pop(request_id, None) is not None:
            for key in [k for k in self.converted if k[0] == request_id]:
                del self.converted[key]

    def __call__(self, out: RequestOutput) -> RequestOutput:
        n, prompt_n = self.top_n.get(out.request_id, (None, None))
        for c in out.outputs if n is not None else ():
            if c.logprobs is not None:
                c.logprobs = self._convert((out.request_id, c.index), c.logprobs, n)
        if prompt_n is not None and out.prompt_logprobs is not None:
            out.prompt_logprobs = [None] + self._convert((out.request_id, -1), out.prompt_logprobs[1:], prompt_n)
        if out.finished:
            self.forget(out.request_id)
        return out

    def _convert(self, key: tuple[str, int], logprobs: list[dict[int, float]], n: int) -> list[dict[int, Logprob]]:
        done = self.converted.setdefault(key, [])
        del done[len(logprobs):]
        done.extend(ranked(lp, n, self._decode) for lp in logprobs[len(done):])
        return list(done)

    def _decode(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        if token_id not in self.texts:
            self.texts[token_id] = self.tokenizer.decode([token_id])
        return self.texts[token_id]
