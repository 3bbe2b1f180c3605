"""OpenAI request bodies and their translation to specray's SamplingParams.

Types are strict (`"max_tokens": true` or `"stream": "yes"` are errors, not 1 and true). Unknown
fields are ignored, as OpenAI-compatible servers do, but a field that would change the output and
that specray does not implement is refused, naming the field, unless it holds its no-op value.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specray.cluster.params import SamplingParams
from specray.cluster.serve.openai_unsupported import EFFECTS, SERVER_SETTINGS, UNSUPPORTED, off
from specray.cluster.serve.prompts import CHAT_ROLES, PromptError, check_text


class ApiError(Exception):
    """An error with its HTTP status and OpenAI error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    @classmethod
    def of(cls, status, message: str, param: str | None = None) -> "ApiError":
        """From one of cluster/serve/errors.py's statuses."""
        return cls(status.http, message, status.openai_type, param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def validation_error(exc: RequestValidationError) -> ApiError:
    """FastAPI's refusal of a body as the OpenAI error, naming the field."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # loc is ("body", <character offset>): not a field
        return ApiError(400, f"request body is not valid JSON: {first.get('msg', '')}")
    where = ".".join(str(x) for x in first.get("loc", ())[1:] if not _union_member(x))
    if not where:  # the body itself: not an object, or missing
        return ApiError(400, "the request body must be a JSON object (Content-Type: application/json)")
    return ApiError(400, f"{where}: {first.get('msg', 'invalid request')}", param=where)


def _union_member(loc_part) -> bool:
    """A location part naming which type of a union pydantic tried (`str`, `list[int]`), not a field."""
    return isinstance(loc_part, str) and (loc_part in ("str", "int", "float", "bool") or "[" in loc_part)


def _check_text(text: str, param: str) -> None:
    try:
        check_text(text, param)
    except PromptError as e:
        raise ApiError(400, str(e), param=param) from None


MAX_REQUEST_ID_CHARS = 256


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vLLM extension
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": true} adds a final usage chunk
    stop_token_ids: list[int] = []  # vLLM extension
    ignore_eos: bool = False  # vLLM extension
    num_speculative_tokens: int | None = None  # specray extension: per-request speculation (0 = off)
    verify_budget: int | None = None  # specray extension: draft tokens verified a round, within the server's
    include_stop_str_in_output: bool = False  # vLLM extension
    skip_special_tokens: bool = True  # vLLM extension
    prompt_logprobs: int | None = None  # vLLM extension: each prompt token's logprob and the top n
    min_p: float = 0.0  # vLLM extension
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM extension
    min_tokens: int = 0  # vLLM extension
    allowed_token_ids: list[int] | None = None  # vLLM extension
    bad_words: list[str] | None = None  # vLLM extension
    truncate_prompt_tokens: int | None = None  # vLLM extension: keep the prompt's last k tokens (-1: the model's length)
    logit_bias: dict[str, float] | None = None  # OpenAI's: token ids (as strings) -> a bias in [-100, 100]
    request_id: str | None = None  # vLLM extension: the response's id is built from it (else a random one)
    cache_salt: str | None = None  # vLLM extension: prefix-cache blocks shared only with the same salt

    @model_validator(mode="before")
    @classmethod
    def _nulls_take_defaults(cls, data: Any) -> Any:
        """OpenAI marks its options nullable and clients send unset ones as null: null takes the
        field's default (a required field's null is still refused)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].is_required() or fields[k].default is None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    NO_OPS: ClassVar[dict[str, Callable[[Any], bool]]] = {}  # an endpoint's own no-op values (vLLM's)

    def refuse_unsupported(self) -> None:
        if self.prompt_logprobs is not None and self.stream:  # as vLLM
            raise ApiError(400, "prompt_logprobs are not available with stream: true", param="prompt_logprobs")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options needs stream: true", param="stream_options")
        options = self.stream_options or {}
        if not isinstance(options.get("include_usage", False), bool):
            raise ApiError(400, "stream_options.include_usage must be true or false", param="stream_options")
        if options.get("continuous_usage_stats"):  # vLLM's usage on every chunk: not implemented
            raise ApiError(400, "stream_options.continuous_usage_stats is not supported by specray; leave it out",
                           param="stream_options")
        for name, value in (self.model_extra or {}).items():
            if name in SERVER_SETTINGS and value is not None:  # a request that sends them expects them applied
                raise ApiError(400, f"{name} is a setting of the server ({SERVER_SETTINGS[name]}), not of a "
                               "request; leave it out", param=name)
            no_op = self.NO_OPS.get(name, UNSUPPORTED.get(name))
            if no_op is not None and not no_op(value):
                effect = EFFECTS.get(name, "it would change the output")
                raise ApiError(400, f"{name} is not supported by specray ({effect}); leave it out", param=name)

    def token_bias(self) -> dict[int, float] | None:
        """logit_bias with integer keys: JSON object keys are strings ("50256": -100)."""
        if not self.logit_bias:
            return None
        bad = next((k for k in self.logit_bias if not (k.isascii() and k.isdigit())), None)
        if bad is not None:  # int() would also take " 5", "5_0" and non-ASCII digits
            raise ApiError(400, f"logit_bias keys must be token ids (integers written as strings), got {bad!r}",
                           param="logit_bias")
        return {int(k): v for k, v in self.logit_bias.items()}

    def target_prompt_logprobs(self) -> int | None:
        """The prompt logprobs the target computes (the completions API's echo adds its own)."""
        return self.prompt_logprobs

    def _or_default(self, name: str, defaults: dict[str, Any]) -> Any:
        """A field the client left unset takes the model's recommendation (generation_config), else ours."""
        return getattr(self, name) if name in self.model_fields_set else defaults.get(name, getattr(self, name))

    def sampling_params(self, default_max_tokens: int, logprobs: int | None,
                        defaults: dict[str, Any] | None = None) -> SamplingParams:
        """`defaults`: the model's sampling defaults (cluster/generation_defaults.py)."""
        self.refuse_unsupported()
        defaults = defaults or {}
        default_max_tokens = defaults.get("max_tokens", default_max_tokens)  # vLLM's: the model's first
        for i, stop in enumerate([self.stop] if isinstance(self.stop, str) else self.stop or []):
            _check_text(stop, f"stop[{i}]")
        for i, word in enumerate(self.bad_words or []):  # the tokenizer raised on a lone surrogate: a 500
            _check_text(word, f"bad_words[{i}]")
        if self.request_id is not None:  # it goes out in every chunk of a stream
            _check_text(self.request_id, "request_id")
            if len(self.request_id) > MAX_REQUEST_ID_CHARS:
                raise ApiError(400, f"request_id has at most {MAX_REQUEST_ID_CHARS} characters", param="request_id")
        try:
            return SamplingParams(n=self.n, temperature=self._or_default("temperature", defaults),
                                  top_p=self._or_default("top_p", defaults), top_k=self._or_default("top_k", defaults),
                                  seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
                                  max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
                                  ignore_eos=self.ignore_eos, logprobs=logprobs,
                                  num_speculative_tokens=self.num_speculative_tokens,
                                  verify_budget=self.verify_budget,
                                  include_stop_str_in_output=self.include_stop_str_in_output,
                                  min_p=self._or_default("min_p", defaults), logit_bias=self.token_bias(),
                                  presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                                  repetition_penalty=self._or_default("repetition_penalty", defaults),
                                  min_tokens=self.min_tokens,
                                  allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
                                  truncate_prompt_tokens=self.truncate_prompt_tokens,
                                  skip_special_tokens=self.skip_special_tokens, cache_salt=self.cache_salt,
                                  prompt_logprobs=self.target_prompt_logprobs())
        except ValueError as e:  # SamplingParamError names the parameter, as the request spells it
            param = getattr(e, "param", None)
            field, message = self.field_name(param), str(e)
            if field != param and message.startswith(f"{param} "):
                message = field + message[len(param):]
            raise ApiError(400, message, param=field) from None

    def field_name(self, param: str | None) -> str | None:
        """The request's field behind a SamplingParams field."""
        return param


class CompletionRequest(_Common):
    NO_OPS: ClassVar[dict[str, Callable[[Any], bool]]] = {"add_special_tokens": off(True)}  # prompts get them
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False  # the prompt before the completion, in the text and (with logprobs) the logprobs

    @property
    def prompt_only(self) -> bool:
        """echo with max_tokens 0: the prompt (and its logprobs) alone, nothing generated."""
        return self.echo and self.max_tokens == 0

    def target_prompt_logprobs(self) -> int | None:
        if not self.echo or self.logprobs is None:
            return self.prompt_logprobs
        if not isinstance(self.logprobs, int) or self.logprobs < 0:  # SamplingParams names it
            return None
        return max(self.prompt_logprobs or 0, self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        if not p:
            raise ApiError(400, "prompt is empty", param="prompt")
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]  # CHAT_ROLES
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None  # a participant's name: the chat template gets it, as vLLM's does
    tool_calls: list[Any] | None = None  # refused unless empty: specray has no tools
    function_call: Any = None  # the legacy form of tool_calls: refused unless null

    def template_fields(self, i: int) -> dict[str, str]:
        """The message as the chat template takes it; `i` names it in errors (messages[i])."""
        if self.tool_calls or self.function_call is not None:
            field = "tool_calls" if self.tool_calls else "function_call"
            raise ApiError(400, "tool calls are not supported by specray", param=f"messages[{i}].{field}")
        fields = {"role": self.role, "content": self.text(f"messages[{i}].content")}
        if self.name is None:
            return fields
        _check_text(self.name, f"messages[{i}].name")
        return {**fields, "name": self.name}

    def text(self, param: str = "messages") -> str:
        """The message's text; `param` names it in errors (messages[i].content)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = [c.get("text") for c in self.content if c.get("type") == "text"]
        if len(parts) != len(self.content):
            raise ApiError(400, "only text content parts are supported", param=param)
        if not all(isinstance(p, str) for p in parts):
            raise ApiError(400, "a text content part needs a string \"text\"", param=param)
        return "\n".join(parts)  # as vLLM joins text parts


class ChatRequest(_Common):
    NO_OPS: ClassVar[dict[str, Callable[[Any], bool]]] = {"add_special_tokens": off(False)}  # the template's
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # vLLM extension: open the assistant's turn after the messages
    continue_final_message: bool = False  # vLLM extension: the reply continues the last message (a prefill)
    echo: bool = False  # vLLM extension: the reply starts with the last message when that has the reply's role

    def template_options(self) -> dict[str, bool]:
        if self.continue_final_message and self.add_generation_prompt:  # as vLLM
            raise ApiError(400, "continue_final_message continues the last message, add_generation_prompt opens a "
                           "new one: set add_generation_prompt to false", param="continue_final_message")
        return {"add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message}

    def reply_role(self) -> str:
        """vLLM's: the assistant's when its turn is opened, else the last message's (it is continued)."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    def echoed(self) -> str:
        """What `echo` puts before the reply: the last message's text when it has the reply's role."""
        last = self.messages[-1]
        return last.text(f"messages[{len(self.messages) - 1}].content") if (
            self.echo and last.role == self.reply_role()) else ""

    def field_name(self, param: str | None) -> str | None:
        if param == "logprobs":  # chat's logprobs is a flag; the count is top_logprobs
            return "top_logprobs"
        if param == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return param

    def top_n(self) -> int | None:
        if self.top_logprobs and not self.logprobs:  # 0 asks for nothing: clients send it by default
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


assert typing.get_args(ChatMessage.model_fields["role"].annotation) == CHAT_ROLES
