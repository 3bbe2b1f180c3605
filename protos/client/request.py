"""Requests of the client SDK: sampling options, prompts and messages as the wire's GenerateRequest,
each value of the wrong kind refused before any call, naming its field."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from specray.client.errors import InvalidArgumentError
from specray.protos.specray.v1 import generate_pb2 as pb


@dataclass
class Sampling:
    """Sampling parameters; None means the server's default (see generate.proto)."""

    max_tokens: int | None = None
    temperature: float | None = None  # 0 = greedy
    top_p: float | None = None
    top_k: int | None = None  # 0 or -1: off
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None  # top alternatives per token; 0 = the emitted token's only
    ignore_eos: bool = False
    num_speculative_tokens: int | None = None  # 0 turns speculation off for this request
    verify_budget: int | None = None  # draft tokens verified a round for this request, within the server's
    prompt_logprobs: int | None = None  # each prompt token's logprob (from the second) and this many top ones
    min_p: float | None = None  # drop tokens below min_p x the most likely one's probability; 0: off
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit, in [-100, 100]
    presence_penalty: float = 0.0  # once per token the output holds, in [-2, 2]
    frequency_penalty: float = 0.0  # per occurrence in the output, in [-2, 2]
    min_tokens: int = 0  # output tokens before EOS, a stop token or a stop string may end a choice
    allowed_token_ids: list[int] | None = None  # only these can be drawn; None: all
    bad_words: list[str] | None = None  # never generated
    repetition_penalty: float | None = None  # divides logits of prompt and output tokens, > 0; 1: off
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: the model's length); None: all
    include_stop_str_in_output: bool = False  # keep a stop string's or stop token's text in the output text
    skip_special_tokens: bool | None = None  # special tokens out of the texts; server: True

    def to_proto(self) -> pb.SamplingParams:
        """The message; a value the message cannot hold (a seed past 2^64, a string for a number)
        raises InvalidArgumentError naming its field, as the server would."""
        msg = pb.SamplingParams()
        if isinstance(self.bad_words, str):  # list() would ban each of its characters
            _refuse("bad_words", "a list of strings, not a string")
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:  # the wire's empty is "all"
            _refuse("allowed_token_ids", "give at least one token id (leave it out for all)")
        values = {"ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
                  "include_stop_str_in_output": self.include_stop_str_in_output,
                  "skip_special_tokens": self.skip_special_tokens,
                  "logit_bias": self.logit_bias or {},
                  "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                  "min_tokens": self.min_tokens, "allowed_token_ids": self.allowed_token_ids or [],
                  "bad_words": self.bad_words or [],
                  "stop": [self.stop] if isinstance(self.stop, str) else self.stop or []}
        for name in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "logprobs", "num_speculative_tokens",
                     "verify_budget", "prompt_logprobs", "repetition_penalty", "truncate_prompt_tokens"):
            values[name] = getattr(self, name)  # unset optionals (None) keep the server's default
        if _is_int(self.seed) and -2 ** 63 <= self.seed < 0:  # HTTP's negative seeds: the same draws mod 2^64
            values["seed"] = self.seed % 2 ** 64
        for name, value in values.items():
            if value is not None:
                _set_field(msg, name, value)
        return msg


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _refuse(field: str, message: str):
    raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}")


BOOL_FIELDS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens")


def _set_field(msg: pb.SamplingParams, name: str, value) -> None:
    """One field of the message; a value of the wrong kind for it is refused, naming it."""
    flag = name in BOOL_FIELDS
    if isinstance(value, bool) != flag:  # True is not 1.0, "no" is not false
        _refuse(name, f"{'true or false' if flag else 'not a bool'}, got {value!r}")
    held = getattr(msg, name)  # a map or a repeated field's container, or the scalar's default
    try:
        if hasattr(held, "update"):
            if not isinstance(value, dict):
                _refuse(name, f"a dict, got {value!r}")
            held.update(value)
        elif hasattr(held, "extend"):
            if not isinstance(value, (list, tuple)):
                _refuse(name, f"a list, got {value!r}")
            held.extend(value)
        else:
            setattr(msg, name, value)
    except (TypeError, ValueError) as e:
        _refuse(name, str(e))


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
                  add_generation_prompt: bool | None = None, cache_salt: str | None = None,
                  **kwargs) -> pb.GenerateRequest:
    """A GenerateRequest from a text or token-id prompt, or chat messages (`continue_final_message`:
    the reply continues the last one; `add_generation_prompt`: open the assistant's turn, by default
    unless continuing), and sampling options (a `Sampling` and/or its fields as keyword arguments);
    `cache_salt`: share prefix-cache blocks only with requests of the same salt."""
    if (continue_final_message or add_generation_prompt is not None) and messages is None:
        raise ValueError("continue_final_message and add_generation_prompt apply to messages: give messages")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of a prompt (text or token ids) or messages")
    if isinstance(messages, (str, bytes, Mapping)):  # iterated, a string's characters were its "messages"
        raise ValueError(f"messages must be a list of {{'role': ..., 'content': ...}} mappings, got one "
                         f"{type(messages).__name__}")
    if sampling is not None and not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a Sampling (or its fields as keyword arguments), got "
                        f"{type(sampling).__name__}")
    if not isinstance(model, str):
        raise TypeError(f"model must be a string, got {type(model).__name__}")
    if kwargs:
        sampling = Sampling(**{**(sampling.__dict__ if sampling else {}), **kwargs})
    req = pb.GenerateRequest(model=model, sampling=(sampling or Sampling()).to_proto())
    if cache_salt is not None:
        if not isinstance(cache_salt, str):
            _refuse("cache_salt", f"a string, got {type(cache_salt).__name__}")
        try:
            req.cache_salt = cache_salt
        except UnicodeEncodeError as e:
            _refuse("cache_salt", f"not valid Unicode text (unpaired surrogate at character {e.start})")
    field = "messages" if messages is not None else "prompt"
    try:
        if messages is not None:
            req.chat.messages.extend(_chat_message(i, m) for i, m in enumerate(messages))
            req.chat.continue_final_message = continue_final_message
            if add_generation_prompt is not None:
                req.chat.add_generation_prompt = add_generation_prompt
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
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        _refuse("prompt", f"a string or a sequence of token ids, got {type(prompt).__name__}")
    if not prompt:
        _refuse("prompt", "empty (no token ids)")
    bad = next((t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)
                or not 0 <= t < 2 ** 31), None)  # the wire's int32
    if bad is not None:
        _refuse("prompt", f"token ids are integers in [0, 2^31), got {bad!r}")
    return [int(t) for t in prompt]
