"""Plain result types of the client SDK and their translation from the wire messages (requests:
request.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specray.protos.specray.v1 import generate_pb2 as pb

_FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORT: "abort"}


@dataclass
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: list[TopLogprob] = field(default_factory=list)  # most likely alternatives first
    rank: int | None = None  # the token's rank in the vocabulary (1: most likely); None where not sent


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the server's prefix cache


@dataclass
class SpeculativeMetrics:
    """Per-request speculative counters, summed over choices."""

    num_rounds: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    acceptance_length: float = 0.0  # tau: tokens emitted per round
    acceptance_rate: float = 0.0  # accepted / drafted


@dataclass
class Choice:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[TokenLogprob] | None = None


@dataclass
class Completion:
    request_id: str
    model: str
    choices: list[Choice]
    usage: Usage
    speculative: SpeculativeMetrics
    prompt_logprobs: list[TokenLogprob] | None = None  # Sampling.prompt_logprobs: the 2nd prompt token on (None: a 1-token prompt)

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text


@dataclass
class Delta:
    """New output of one choice, as streamed."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # set on the choice's last delta
    logprobs: list[TokenLogprob] | None = None


@dataclass
class StreamSummary:
    """How a stream ended: per-choice finish, usage and speculative counters."""

    request_id: str
    finish_reasons: list[str | None]  # by choice index
    stop_reasons: list[int | str | None]
    usage: Usage
    speculative: SpeculativeMetrics
    model: str = ""  # the served model's name (empty from servers before it was sent)
    prompt_logprobs: list[TokenLogprob] | None = None  # Sampling.prompt_logprobs: the 2nd prompt token on (None: a 1-token prompt)


@dataclass
class Model:
    id: str
    owned_by: str
    max_model_len: int
    speculative_method: str  # "" when speculation is off


# -- from the wire --------------------------------------------------------------------------
def _logprobs(items) -> list[TokenLogprob] | None:
    if not items:
        return None
    return [TokenLogprob(x.token_id, x.token, x.logprob, [TopLogprob(t.token_id, t.token, t.logprob) for t in x.top],
                         x.rank if x.HasField("rank") else None)
            for x in items]


def _stop_reason(finish: pb.ChoiceFinish) -> int | str | None:
    which = finish.WhichOneof("stop_reason")
    return None if which is None else getattr(finish, which)


def _usage(u: pb.Usage) -> Usage:
    return Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens)


def _speculative(s: pb.SpeculativeMetrics) -> SpeculativeMetrics:
    return SpeculativeMetrics(s.num_rounds, s.num_draft_tokens, s.num_accepted_tokens, s.num_emitted_tokens,
                              s.acceptance_length, s.acceptance_rate)


def completion_from_proto(msg: pb.CompleteResponse) -> Completion:
    choices = [Choice(c.index, c.text, list(c.token_ids), _FINISH.get(c.finish.finish_reason),
                      _stop_reason(c.finish), _logprobs(c.logprobs)) for c in msg.choices]
    return Completion(msg.request_id, msg.model, choices, _usage(msg.usage), _speculative(msg.speculative),
                      _logprobs(msg.prompt_logprobs))


def delta_from_proto(d: pb.ChoiceDelta) -> Delta:
    return Delta(d.index, d.text, list(d.token_ids), _FINISH.get(d.finish_reason), _logprobs(d.logprobs))


def summary_from_proto(request_id: str, s: pb.GenerateSummary) -> StreamSummary:
    ordered = sorted(s.choices, key=lambda c: c.index)
    return StreamSummary(request_id, [_FINISH.get(c.finish_reason) for c in ordered],
                         [_stop_reason(c) for c in ordered], _usage(s.usage), _speculative(s.speculative), s.model,
                         _logprobs(s.prompt_logprobs))


def model_from_proto(m: pb.Model) -> Model:
    return Model(m.id, m.owned_by, m.max_model_len, m.speculative_method)


def assemble(deltas: Sequence[Delta], summary: StreamSummary | None, model: str = "") -> Completion:
    """The full result that a stream's deltas and summary add up to."""
    n = max([d.index + 1 for d in deltas] + [len(summary.finish_reasons) if summary else 0])
    choices = [Choice(i, "", [], None) for i in range(n)]
    for d in deltas:
        c = choices[d.index]
        c.text += d.text
        c.token_ids += d.token_ids
        if d.logprobs:
            c.logprobs = (c.logprobs or []) + d.logprobs
    if summary is None:
        return Completion("", model, choices, Usage(), SpeculativeMetrics())
    for c, reason, stop in zip(choices, summary.finish_reasons, summary.stop_reasons):
        c.finish_reason, c.stop_reason = reason, stop
    return Completion(summary.request_id, summary.model or model, choices, summary.usage, summary.speculative,
                      summary.prompt_logprobs)
