"""Plain result types of the client SDK and their translation from/to the wire messages."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from specray.client.errors import InvalidArgumentError
from specray.protos.specray.v1 import generate_pb2 as pb

_FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORT: "abort"}


@dataclass
class Sampling:
    """Sampling parameters; None means the server's default (see generate.proto)."""

    max_tokens: int | None = None
    temperature: float | None = None  # 0 = greedy; server default 1.0
    top_p: float | None = None
    top_k: int = 0
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None  # top alternatives per token; 0 = the emitted token's only
    ignore_eos: bool = False
    num_speculative_tokens: int | None = None  # 0 turns speculation off for this request
    verify_budget: int | None = None  # draft tokens verified a round for this request, within the server's
    prompt_logprobs: int | None = None  # each prompt token's logprob (from the second) and this many top ones
    min_p: float = 0.0  # drop tokens below min_p x the most likely one's probability
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit, in [-100, 100]
    presence_penalty: float = 0.0  # once per token the output holds, in [-2, 2]
    frequency_penalty: float = 0.0  # per occurrence in the output, in [-2, 2]
    min_tokens: int = 0  # output tokens before EOS, a stop token or a stop string may end a choice
    allowed_token_ids: list[int] | None = None  # only these can be drawn; None: all
    bad_words: list[str] | None = None  # never generated
    repetition_penalty: float | None = None  # divides logits of prompt and output tokens, > 0; server: 1.0
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: the model's length); None: all

    def to_proto(self) -> pb.SamplingParams:
        """The message; a value the message cannot hold (a seed past 2^64, a string for a number)
        raises InvalidArgumentError naming its field, as the server would."""
        msg = pb.SamplingParams()
        if isinstance(self.bad_words, str):  # list() would ban each of its characters
            raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "bad_words: a list of strings, not a string")
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:  # the wire's empty is "all"
            raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT,
                                       "allowed_token_ids: give at least one token id (leave it out for all)")
        values = {"top_k": self.top_k, "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
                  "min_p": self.min_p, "logit_bias": self.logit_bias or {},
                  "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                  "min_tokens": self.min_tokens, "allowed_token_ids": self.allowed_token_ids or [],
                  "bad_words": self.bad_words or [],
                  "stop": [self.stop] if isinstance(self.stop, str) else self.stop or []}
        for name in ("max_tokens", "temperature", "top_p", "n", "seed", "logprobs", "num_speculative_tokens",
                     "verify_budget", "prompt_logprobs", "repetition_penalty", "truncate_prompt_tokens"):
            values[name] = getattr(self, name)  # unset optionals (None) keep the server's default
        for name, value in values.items():
            if value is None:
                continue
            if isinstance(value, bool) != (name == "ignore_eos"):  # True is not 1.0, "no" is not false
                want = "true or false" if name == "ignore_eos" else "not a bool"
                raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {want}, got {value!r}")
            many = name in ("stop_token_ids", "allowed_token_ids", "bad_words", "stop", "logit_bias")
            if many and not isinstance(value, (list, tuple, dict)):
                raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT,
                                           f"{name}: a {'dict' if name == 'logit_bias' else 'list'}, got {value!r}")
            try:
                if many:
                    value = dict(value) if isinstance(value, dict) else list(value)
                if isinstance(value, list):
                    getattr(msg, name).extend(value)
                elif isinstance(value, dict):
                    getattr(msg, name).update(value)
                else:
                    setattr(msg, name, value)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {e}") from None
        return msg


Prompt = str | Sequence[int]
Message = Mapping[str, str]  # {"role": ..., "content": ...}


def _chat_message(index: int, m: Message) -> pb.ChatMessage:
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        raise ValueError(f"messages[{index}] must be a mapping with a 'role' string, got {m!r}")
    content, name = m.get("content"), m.get("name")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"messages[{index}]['content'] must be a string, got {type(content).__name__}")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"messages[{index}]['name'] must be a string, got {type(name).__name__}")
    return pb.ChatMessage(role=m["role"], content=content or "", name=name)


def build_request(prompt: Prompt | None = None, messages: Sequence[Message] | None = None,
                  model: str = "", sampling: Sampling | None = None, continue_final_message: bool = False,
                  **kwargs) -> pb.GenerateRequest:
    """A GenerateRequest from a text or token-id prompt, or chat messages (`continue_final_message`:
    the reply continues the last one), and sampling options (a `Sampling` and/or its fields as
    keyword arguments)."""
    if continue_final_message and messages is None:
        raise ValueError("continue_final_message continues the last of the messages: give messages")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of a prompt (text or token ids) or messages")
    if sampling is not None and not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a Sampling (or its fields as keyword arguments), got "
                        f"{type(sampling).__name__}")
    if not isinstance(model, str):
        raise TypeError(f"model must be a string, got {type(model).__name__}")
    if kwargs:
        sampling = Sampling(**{**(sampling.__dict__ if sampling else {}), **kwargs})
    req = pb.GenerateRequest(model=model, sampling=(sampling or Sampling()).to_proto())
    field = "messages" if messages is not None else "prompt"
    try:
        if messages is not None:
            req.chat.messages.extend(_chat_message(i, m) for i, m in enumerate(messages))
            req.chat.continue_final_message = continue_final_message
        elif isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(_token_ids(prompt))
    except UnicodeEncodeError as e:  # a lone surrogate: protobuf strings are UTF-8
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: not valid Unicode text "
                                   f"(unpaired surrogate at character {e.start})") from None
    return req


def _token_ids(prompt) -> list[int]:
    """A token-id prompt as ints: bytes (which iterate as ints), other element types and ids the
    wire cannot hold are refused, naming the prompt."""
    def refuse(message: str):
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"prompt: {message}")

    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        refuse(f"a string or a sequence of token ids, got {type(prompt).__name__}")
    if not prompt:
        refuse("empty (no token ids)")
    bad = next((t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None or any(not 0 <= t < 2 ** 32 for t in prompt):
        refuse(f"token ids are integers in [0, 2^32), got {bad if bad is not None else max(prompt)!r}")
    return [int(t) for t in prompt]


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
    return [TokenLogprob(x.token_id, x.token, x.logprob, [TopLogprob(t.token_id, t.token, t.logprob) for t in x.top])
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
