"""OpenAI request bodies and their translation to specray's SamplingParams.

Unknown fields are ignored (as OpenAI-compatible servers do), but fields that would change the
output and that specray does not implement are rejected rather than silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specray.cluster.params import SamplingParams


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


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False  # vLLM extension
    num_speculative_tokens: int | None = None  # specray extension: per-request speculation (0 = off)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def sampling_params(self, default_max_tokens: int, logprobs: int | None) -> SamplingParams:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported by specray (it would change the distribution)", param=name)
        try:
            return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                  seed=self.seed, stop=self.stop,
                                  max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
                                  ignore_eos=self.ignore_eos, logprobs=logprobs,
                                  num_speculative_tokens=self.num_speculative_tokens)
        except ValueError as e:
            raise ApiError(400, str(e)) from None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False

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
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = [c.get("text", "") for c in self.content if c.get("type") == "text"]
        if len(parts) != len(self.content):
            raise ApiError(400, "only text content parts are supported", param="messages")
        return "".join(parts)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def top_n(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
