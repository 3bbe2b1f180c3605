"""Public request parameters, shaped like vLLM's `SamplingParams`; validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from specray.kernels.sampling import SamplingConfig


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 disables
    seed: int | None = None
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # top-n logprobs per output token (0: the chosen token's only)
    num_speculative_tokens: int | None = None  # per-request override; 0 turns speculation off
    # Draft tokens (tree nodes) verified per round for this request, at most; the smaller of this and
    # speculative_config['verify_budget'] applies. num_speculative_tokens is a chain's length or a tree's depth.
    verify_budget: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if self.top_k == -1:
            self.top_k = 0
        _check(isinstance(self.n, int) and self.n >= 1, f"n must be >= 1, got {self.n}")
        _check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be >= 0 or -1, got {self.top_k}")
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1,
               f"max_tokens must be an integer >= 1, got {self.max_tokens}")
        _check(self.logprobs is None or self.logprobs >= 0, f"logprobs must be >= 0, got {self.logprobs}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings")
        _check(self.num_speculative_tokens is None or self.num_speculative_tokens >= 0,
               f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
        _check(self.verify_budget is None or (isinstance(self.verify_budget, int) and self.verify_budget >= 1),
               f"verify_budget must be an integer >= 1, got {self.verify_budget}")

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
