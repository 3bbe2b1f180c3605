"""The router's frozen limits and its running statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from specray.cluster.params import SamplingParamError, SamplingParams
from specray.kernels.drafters import registry
from specray.kernels.ints import ceil_div
from specray.kernels.proposal import VerifyResult


@dataclass(frozen=True)
class RouterLimits:
    max_model_len: int
    vocab_size: int
    kv_capacity_tokens: int  # target KV slots; admission reserves a request's worst case
    block_size: int = 16
    max_num_seqs: int = 32
    num_speculative_tokens: int = 0  # 0 without a drafter
    # (min running sequences, draft tokens at most), ascending: speculation shortens, then stops, under load
    speculation_schedule: tuple[tuple[int, int], ...] = ()
    pipelined: bool = False  # two groups in flight: draft one while the target verifies the other
    verify_budget: int | None = None  # draft tokens (tree nodes) verified per sequence per round at most
    max_draft_tokens: int = 0  # the most draft tokens (tree nodes) one round verifies: KV reserved for them
    verify_rule: str = "auto"  # sampled requests: "auto" (from the proposal's kind) or a fixed rule
    # what the draft reads of the target each round (Method.target_features): "hidden", "last_kv" or None
    draft_features: str | None = None
    adaptive: bool = False  # each round picks each sequence's draft length (cluster/router/adaptive.py)
    model_tokens: int | None = None  # draft-model steps a round runs at most (lookup first); None: its length
    # prompt tokens a round prefills at most, a longer prompt in chunks over several rounds: a first
    # token waits for the prompts ahead of it only, and running sequences decode between the chunks
    # of a long prompt; None: no bound, every prompt whole
    max_prefill_tokens: int | None = None
    # the same while other sequences decode (each waits for the round: a smaller chunk bounds their
    # inter-token gaps); None: max_prefill_tokens
    decoding_prefill_tokens: int | None = None
    prefix_caching: bool = False  # the target shares full KV blocks of equal prefixes (admission counts on it)

    def __post_init__(self) -> None:
        assert self.max_model_len >= 2 and self.max_num_seqs >= 1 and self.num_speculative_tokens >= 0
        assert self.max_prefill_tokens is None or self.max_prefill_tokens >= 1
        assert self.decoding_prefill_tokens is None or self.decoding_prefill_tokens >= 1
        thresholds = [t for t, _ in self.speculation_schedule]
        assert thresholds == sorted(set(thresholds)) and all(k >= 0 for _, k in self.speculation_schedule)

    def prefill_budget(self, decoding: bool) -> int | None:
        """A round's prompt tokens at most, `decoding`: beside sequences that decode (None: no bound)."""
        if not decoding or self.decoding_prefill_tokens is None:
            return self.max_prefill_tokens
        return min(self.max_prefill_tokens or self.decoding_prefill_tokens, self.decoding_prefill_tokens)

    def reservation(self, prompt_len: int, max_tokens: int) -> int:
        """KV slots a request's sequence may use at worst, in whole blocks (a tree's nodes included),
        at most the whole cache: near its end a sequence drafts only what its slots hold (`draft_room`)."""
        spec_tokens = max(self.num_speculative_tokens, self.max_draft_tokens)
        tokens = min(prompt_len + max_tokens, self.max_model_len) + spec_tokens + 1
        return min(ceil_div(tokens, self.block_size) * self.block_size, self.kv_capacity_tokens)

    def draft_room(self, prompt_len: int, max_tokens: int, num_tokens: int) -> int:
        """Draft tokens (tree nodes) a sequence of `num_tokens` tokens may verify within its reserved
        slots beside its bonus token."""
        return max(0, self.reservation(prompt_len, max_tokens) - num_tokens - 1)

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams, has_tokenizer: bool = True) -> None:
        """ValueError for a request these limits could never run; nothing reaches a worker unchecked."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"expected SamplingParams, got {type(params).__name__}")
        params.check()  # again: a field may have changed since it was built
        params = params.for_prompt(len(prompt_token_ids), self.max_model_len)
        if not prompt_token_ids:
            raise SamplingParamError("prompt", "prompt is empty: it must contain at least one token")
        if len(prompt_token_ids) >= self.max_model_len:
            raise SamplingParamError("prompt", f"prompt has {len(prompt_token_ids)} tokens; the model's context is "
                                    f"{self.max_model_len} tokens, leaving no room to generate")
        if self.reservation(len(prompt_token_ids), params.max_tokens) > self.kv_capacity_tokens:
            raise SamplingParamError("max_tokens", "request can never fit in the KV cache; lower max_tokens or raise "
                                    "the cache size")
        vocab = self.vocab_size
        if any(type(t) is not int or not 0 <= t < vocab for t in prompt_token_ids):
            raise SamplingParamError("prompt", f"prompt token ids must be integers in [0, {vocab})")
        if not has_tokenizer and params.bad_words:
            raise SamplingParamError("bad_words", "bad_words need a tokenizer, and this engine has none; "
                                                  "use logit_bias with -100")
        if not has_tokenizer and params.stop:
            raise SamplingParamError("stop", "stop strings need a tokenizer, and this engine has none; "
                                             "use stop_token_ids")
        if params.n > self.max_num_seqs:
            raise SamplingParamError("n", f"n={params.n} exceeds max_num_seqs {self.max_num_seqs}: "
                                    "a request's choices must fit in one running batch")
        if params.logprobs is not None and params.logprobs > vocab:
            raise SamplingParamError("logprobs", f"logprobs must be <= the vocabulary size {vocab}, "
                                                 f"got {params.logprobs}")
        if any(t >= vocab for t in params.stop_token_ids):
            raise SamplingParamError("stop_token_ids", f"stop_token_ids must be in [0, {vocab})")
        if any(t >= vocab for t in params.logit_bias or {}):
            raise SamplingParamError("logit_bias", f"logit_bias token ids must be in [0, {vocab})")
        if any(t >= vocab for t in params.allowed_token_ids or ()):
            raise SamplingParamError("allowed_token_ids", f"allowed_token_ids must be in [0, {vocab})")

    def draft_cap(self, num_running: int) -> int:
        """Draft tokens allowed per sequence while `num_running` sequences run."""
        cap = self.num_speculative_tokens
        for threshold, k in self.speculation_schedule:
            if num_running >= threshold:
                cap = min(cap, k)
        return cap


def fit_context(max_model_len: int | None, limit: int, capacity: int, spec) -> int:
    """The context one sequence may fill: the model's (`limit`), cut to what a KV cache of `capacity`
    tokens holds where not set, whatever the speculation (`spec`, unused: greedy speculative output must
    equal plain decoding's, length cut included); a set one the cache cannot hold is refused at
    start-up, as vLLM does, rather than every long request later."""
    if max_model_len is not None and not 2 <= max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [2, {limit}], got {max_model_len}")
    # not less for speculation: the context (and with it where a request stops) must not depend on
    # it; a sequence near the cache's end drafts only what its slots hold
    room = capacity - 1
    if max_model_len is None:
        if room < 2:
            raise ValueError(f"the KV cache ({capacity} tokens) leaves no room for a sequence; raise kv_cache_tokens")
        return min(limit, room)
    if max_model_len > room:
        raise ValueError(f"max_model_len {max_model_len} does not fit in the KV cache ({capacity} tokens); lower "
                         "max_model_len or raise kv_cache_tokens")
    return max_model_len


def router_limits(model_config, tokenizer, spec, max_model_len: int | None, max_num_seqs: int,
                  num_blocks: int, block_size: int, pipelined: bool = False,
                  prefill_tokens: tuple[int | None, int | None] = (None, None),
                  prefix_caching: bool = False) -> tuple[RouterLimits, set[int]]:
    """The router's limits from the target's ModelConfig and the SpeculativeConfig (or None);
    `prefill_tokens`: a round's prompt tokens at most, alone and beside decoding sequences
    (config/defaults.py `resolve_prefill_tokens`)."""
    limit = model_config.max_position_embeddings
    max_prefill_tokens, decoding_prefill_tokens = prefill_tokens
    max_model_len = fit_context(max_model_len, limit, num_blocks * block_size, spec)
    if spec is not None and spec.method == "longspec":  # its window against the context served
        from specray.kernels.drafters.longspec_folder import check_pairing

        check_pairing(spec.model, model_config, spec.longspec, max_model_len)
    eos = set(model_config.eos_token_ids) or ({tokenizer.eos_token_id} if tokenizer is not None else set())
    return RouterLimits(
        max_model_len=max_model_len, vocab_size=model_config.vocab_size,
        kv_capacity_tokens=num_blocks * block_size, block_size=block_size, max_num_seqs=max_num_seqs,
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        speculation_schedule=spec.schedule() if spec else (), pipelined=pipelined and spec is not None,
        verify_budget=spec.verify_budget if spec else None,
        max_draft_tokens=spec.max_draft_tokens() if spec else 0, verify_rule=spec.verify if spec else "auto",
        draft_features=None if spec is None else registry.method(spec.method).target_features,
        adaptive=spec is not None and spec.adaptive, model_tokens=spec.model_tokens() if spec else None,
        max_prefill_tokens=max_prefill_tokens, decoding_prefill_tokens=decoding_prefill_tokens,
        prefix_caching=prefix_caching), eos


@dataclass
class RouterStats:
    """Wall time the router spent waiting on each pool (benchmarks read it)."""

    steps: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    prefill_seconds: float = 0.0  # the part of target_seconds spent in steps that held a prefill
    num_drafts: int = 0  # rounds in which a sequence had draft tokens verified
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [max k] acceptances at draft position i
    draft_fallbacks: int = 0  # rounds decoded target-only because the draft pool was unavailable
    target_failures: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of them, the tokens the target found in its prefix cache

    def record_round(self, res: VerifyResult) -> None:
        if res.num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += res.num_draft_tokens
        self.num_accepted_tokens += res.num_accepted
        self.accepted_per_pos.extend([0] * (res.num_draft_tokens - len(self.accepted_per_pos)))
        for pos in range(res.num_accepted):
            self.accepted_per_pos[pos] += 1
