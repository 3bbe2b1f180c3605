"""Public request parameters, shaped like vLLM's `SamplingParams`; validated on construction."""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field, replace

from specray.kernels.sampling import SamplingConfig

MAX_LOGPROBS = 20  # top logprobs per token at most, as OpenAI's top_logprobs and vLLM's max_logprobs
MAX_SEED = 2**63 - 1  # seeds travel as int64 between the pools (choice i draws with choice_seed(seed, i))
MIN_SEED, MAX_API_SEED = -2**63, 2**64 - 1  # what clients send: int64 (vLLM, OpenAI) or uint64 (our gRPC)
MAX_TOP_K = 2**31 - 1  # top_k travels as int32
MAX_LOGIT_BIAS, MAX_BIAS = 1024, 100  # token ids a request may bias; OpenAI's range of a bias
MAX_STOPS = 64  # stop strings and stop token ids each: every round scans them for every sequence
# characters of one stop string or bad word: each is tokenized or indexed on the rounds' thread when
# its request is added, which stalls every stream (a body's 6 MB of bad words took seconds)
MAX_STOP_CHARS = 4096
MAX_SALT_CHARS = 1024  # a cache salt names a tenant: a key's worth of text is plenty
MAX_ALLOWED_IDS = 262144  # the largest vocabularies'; more could only repeat ids (a million cost the rounds' thread 0.2 s)

# vLLM SamplingParams fields specray does not implement -> the values that leave the output unchanged
# (the first is the default); the HTTP API's table of refused fields starts from it
NO_OP_FIELDS: dict[str, tuple] = {
    "best_of": (None, 1),
    "logits_processors": (None, []), "detokenize": (True,), "spaces_between_special_tokens": (True,),
    "structured_outputs": (None,), "guided_decoding": (None,),
}


SCALAR_FIELDS = ("n", "temperature", "top_p", "top_k", "seed", "max_tokens", "logprobs", "prompt_logprobs",
                 "num_speculative_tokens", "verify_budget", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "min_tokens", "truncate_prompt_tokens")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 disables
    seed: int | None = None
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = field(default_factory=list)  # None (vLLM's default): none
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # top-n logprobs per output token (0: the chosen token's only)
    prompt_logprobs: int | None = None  # top-n logprobs per prompt token (0: the prompt token's only)
    num_speculative_tokens: int | None = None  # per request, at most the config's; 0 turns speculation off
    # Draft tokens (tree nodes) verified per round for this request, at most; the smaller of this and
    # speculative_config['verify_budget'] applies. num_speculative_tokens is a chain's length or a tree's depth.
    verify_budget: int | None = None
    min_p: float = 0.0  # drop tokens below min_p x the most likely one's probability (after temperature)
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (OpenAI's: in [-100, 100])
    presence_penalty: float = 0.0  # subtracted once from the logit of every token in the output so far
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output so far
    repetition_penalty: float = 1.0  # divides (multiplies, if negative) a logit of a prompt or output token
    min_tokens: int = 0  # output tokens before EOS, a stop token id or a stop string may end it
    allowed_token_ids: list[int] | None = None  # only these tokens can be drawn (None: all)
    bad_words: list[str] | None = None  # never generated: a word's last token is not drawn after its others
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: the model's length), as vLLM
    # prefix-cache blocks are shared only between requests of the same salt (vLLM's prompt `cache_salt`)
    cache_salt: str | None = None
    # vLLM's fields that specray does not implement: each takes only its no-op value (NO_OP_FIELDS), so
    # ported code that spells out vLLM's defaults runs, and any other value is refused by name
    best_of: int | None = None
    logits_processors: list | None = None
    detokenize: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: object | None = None
    guided_decoding: object | None = None

    def __post_init__(self) -> None:
        self.check()

    def _plain_numbers(self) -> None:
        """NumPy scalars (`max_tokens=np.int64(5)`, token ids from an array) as Python numbers."""
        for f in SCALAR_FIELDS:
            setattr(self, f, _plain(getattr(self, f)))
        for f in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(self, f)
            if isinstance(ids, (list, tuple)):  # a copy either way: a running request keeps its own
                setattr(self, f, list(ids) if _all_ints(ids) else [_plain(t) for t in ids])
        if isinstance(self.logit_bias, dict):
            self.logit_bias = {_plain(t): _plain(b) for t, b in self.logit_bias.items()}

    def check(self) -> None:
        """Validate (and normalise: a stop string becomes a list of one, top_k -1 becomes 0); the
        router runs it again when a request is added, so fields changed after construction are
        held to the same rules."""
        self._plain_numbers()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:  # vLLM's default
            self.stop_token_ids = []
        check_param(isinstance(self.stop, (list, tuple, type(None))), "stop",
                    f"stop must be a string or a list of strings, got {self.stop!r}")
        check_param(isinstance(self.stop_token_ids, (list, tuple)), "stop_token_ids",
                    f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
        self.stop = list(self.stop or [])
        if self.top_k == -1:
            self.top_k = 0
        check_param(_is_int(self.n) and self.n >= 1, "n", f"n must be an integer >= 1, got {self.n!r}")
        check_param(_is_number(self.temperature) and 0.0 <= self.temperature < math.inf, "temperature",
                    f"temperature must be a finite number >= 0, got {self.temperature!r}")
        check_param(_is_number(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p",
                    f"top_p must be in (0, 1], got {self.top_p!r}")
        check_param(_is_int(self.top_k) and 0 <= self.top_k <= MAX_TOP_K, "top_k",
                    f"top_k must be an integer in [0, {MAX_TOP_K}] or -1, got {self.top_k!r}")
        check_param(self.seed is None or (_is_int(self.seed) and MIN_SEED <= self.seed <= MAX_API_SEED), "seed",
                    f"seed must be an integer in [{MIN_SEED}, {MAX_API_SEED}], got {self.seed!r}")
        check_param(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1), "max_tokens",
                    f"max_tokens must be an integer >= 1 or None (up to the model's length), got {self.max_tokens!r}")
        check_param(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
                    "logprobs",
                    f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        check_param(self.prompt_logprobs is None or (_is_int(self.prompt_logprobs)
                                                     and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
                    "prompt_logprobs",
                    f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs!r}")
        check_param(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings")
        check_param(_token_ids(self.stop_token_ids), "stop_token_ids",
                    "stop_token_ids must be integers >= 0")
        check_param(len(self.stop) <= MAX_STOPS and len(self.stop_token_ids) <= MAX_STOPS,
                    "stop" if len(self.stop) > MAX_STOPS else "stop_token_ids",
                    f"at most {MAX_STOPS} stop strings and {MAX_STOPS} stop_token_ids")
        check_param(all(len(s) <= MAX_STOP_CHARS for s in self.stop), "stop",
                    f"a stop string has at most {MAX_STOP_CHARS} characters")
        for name in ("stop", "bad_words"):  # a lone surrogate ("\ud800") is no text: the tokenizer raised
            words = getattr(self, name) or []
            check_param(all(_is_text(w) for w in words if isinstance(w, str)), name,
                        f"{name} must be valid Unicode text (no unpaired surrogates)")
        check_param(self.num_speculative_tokens is None or (_is_int(self.num_speculative_tokens)
                                                            and self.num_speculative_tokens >= 0),
                    "num_speculative_tokens",
                    f"num_speculative_tokens must be an integer >= 0, got {self.num_speculative_tokens!r}")
        check_param(self.verify_budget is None or (_is_int(self.verify_budget) and self.verify_budget >= 1),
                    "verify_budget",
                    f"verify_budget must be an integer >= 1, got {self.verify_budget!r}")
        check_param(_is_number(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p",
                    f"min_p must be a number in [0, 1], got {self.min_p!r}")
        check_param(self.logit_bias is None or (
            isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_LOGIT_BIAS
            and all(_is_int(t) and t >= 0 and _is_number(b) and -MAX_BIAS <= b <= MAX_BIAS
                    for t, b in self.logit_bias.items())), "logit_bias",
                    f"logit_bias must map at most {MAX_LOGIT_BIAS} token ids (integers >= 0) to numbers in "
                    f"[-{MAX_BIAS}, {MAX_BIAS}], got {_short(self.logit_bias)}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check_param(_is_number(value) and -2.0 <= value <= 2.0, name,
                        f"{name} must be a number in [-2, 2], got {value!r}")
        check_param(_is_number(self.repetition_penalty) and 0.0 < self.repetition_penalty < math.inf,
                    "repetition_penalty",
                    f"repetition_penalty must be a finite number > 0 (as vLLM's), got {self.repetition_penalty!r}")
        check_param(_is_int(self.min_tokens) and 0 <= self.min_tokens and (
            self.max_tokens is None or not _is_int(self.max_tokens) or self.min_tokens <= self.max_tokens),
                    "min_tokens", f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        check_param(self.allowed_token_ids is None or (
            isinstance(self.allowed_token_ids, (list, tuple)) and 0 < len(self.allowed_token_ids) <= MAX_ALLOWED_IDS
            and _token_ids(self.allowed_token_ids)), "allowed_token_ids",
                    f"allowed_token_ids must be a non-empty list of at most {MAX_ALLOWED_IDS} token ids (integers "
                    f">= 0) or None, got {_short(self.allowed_token_ids)}")
        check_param(self.bad_words is None or (isinstance(self.bad_words, (list, tuple)) and len(self.bad_words) <=
                                                MAX_STOPS and all(isinstance(w, str) and w.strip() and len(w) <= MAX_STOP_CHARS
                                                                  for w in self.bad_words)),
                    "bad_words", f"bad_words must be a list of at most {MAX_STOPS} non-blank strings of at most "
                    f"{MAX_STOP_CHARS} characters, got "
                    f"{_short(self.bad_words)}")
        check_param(self.truncate_prompt_tokens is None or (_is_int(self.truncate_prompt_tokens) and (
            self.truncate_prompt_tokens >= 1 or self.truncate_prompt_tokens == -1)), "truncate_prompt_tokens",
                    f"truncate_prompt_tokens must be an integer >= 1, -1 (the model's length) or None, got "
                    f"{self.truncate_prompt_tokens!r}")
        check_param(self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt
                                                and len(self.cache_salt) <= MAX_SALT_CHARS and _is_text(self.cache_salt)),
                    "cache_salt", f"cache_salt must be a non-empty string of at most {MAX_SALT_CHARS} characters "
                    f"or None, got {_short(self.cache_salt)}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            value = getattr(self, name)  # "no" is truthy
            check_param(type(value) is bool, name, f"{name} must be True or False, got {value!r}")
        for name, no_ops in NO_OP_FIELDS.items():
            value = getattr(self, name)
            check_param(is_no_op(value, no_ops), name,
                        f"{name}={value!r} is not supported by specray (only its no-op value "
                        f"{no_ops[0]!r}); leave it out")

    def truncated(self, prompt_token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's last `truncate_prompt_tokens` tokens (all of it where None), as vLLM cuts it
        (from the left); a bound past the model's length is refused, as vLLM does."""
        if self.truncate_prompt_tokens is None:
            return prompt_token_ids
        check_param(self.truncate_prompt_tokens <= max_model_len, "truncate_prompt_tokens",
                    f"truncate_prompt_tokens={self.truncate_prompt_tokens} is greater than the model's length "
                    f"({max_model_len})")
        keep = kept_length(len(prompt_token_ids), self.truncate_prompt_tokens, max_model_len)
        return prompt_token_ids[len(prompt_token_ids) - keep:]

    def for_prompt(self, prompt_len: int, max_model_len: int) -> "SamplingParams":
        """A copy for one request: later changes to this object do not reach a running request, and
        max_tokens None becomes the room the model's length leaves beside the prompt (vLLM's rule)."""
        room = max(1, max_model_len - prompt_len)
        return replace(self, max_tokens=room if self.max_tokens is None else self.max_tokens)

    def sampling_config(self) -> SamplingConfig:
        bias = tuple(sorted((int(t), float(b)) for t, b in (self.logit_bias or {}).items() if b != 0))
        return SamplingConfig(self.temperature, self.top_k, self.top_p, float(self.min_p), bias,
                              tuple(sorted(set(self.allowed_token_ids or ()))),
                              float(self.repetition_penalty), float(self.frequency_penalty),
                              float(self.presence_penalty))


def kept_length(prompt_len: int, truncate_prompt_tokens: int | None, max_model_len: int) -> int:
    """Prompt tokens that run under `truncate_prompt_tokens` (-1: the model's length; None: all)."""
    if truncate_prompt_tokens is None:
        return prompt_len
    return min(prompt_len, max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens)


def is_no_op(value, no_ops: tuple) -> bool:
    """`value` is one of `no_ops` (a bool only as itself: False is not a penalty of 0)."""
    for v in no_ops:
        try:
            if value is v or (type(value) is not bool and type(v) is not bool and bool(value == v)):
                return True
        except (TypeError, ValueError, RuntimeError):  # an array compared elementwise
            pass
    return False


def _plain(x):
    """A NumPy or other registered integer or real as Python's int or float (JSON, protobuf and the
    pools take those); anything else (bools included) as it is, for the checks to judge."""
    if type(x) in (bool, int, float):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    return float(x) if isinstance(x, numbers.Real) else x


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _all_ints(values) -> bool:
    """Every value an int, not a bool (one C pass: a vocabulary-long allowed_token_ids is checked
    four times a request, and a Python call per id cost it 15 ms a check)."""
    return set(map(type, values)) <= {int}


def _token_ids(values) -> bool:
    return _all_ints(values) and (not values or min(values) >= 0)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class SamplingParamError(ValueError):
    """A refused sampling parameter; `param` names it (an OpenAI error body's `param`)."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def check_param(ok: bool, param: str | None, message: str) -> None:
    """SamplingParamError(param, message) unless `ok` (the router's request checks share it)."""
    if not ok:
        raise SamplingParamError(param, message)


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s sampler seed: seed + index folded into [0, MAX_SEED], the pools' int64 range."""
    return None if seed is None else (seed + index) % (MAX_SEED + 1)


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


SHORT_ITEMS = 16  # items of a long list or dict that a message shows


def _short(value) -> str:
    """A refused value for its message, from its first items only (a long list's whole repr cost
    milliseconds on every request, refused or not)."""
    if isinstance(value, (list, tuple)) and len(value) > SHORT_ITEMS:
        ends = "()" if isinstance(value, tuple) else "[]"
        text = ends[0] + ", ".join(map(repr, value[:SHORT_ITEMS])) + ", ..." + ends[1]
    elif isinstance(value, dict) and len(value) > SHORT_ITEMS:
        text = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in itertools.islice(value.items(), SHORT_ITEMS)) + ", ...}"
    else:
        text = repr(value[:100] if isinstance(value, str) else value)
    return text if len(text) <= 80 else text[:77] + "..."
