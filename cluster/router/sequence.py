"""Router-side state of one sequence: committed tokens, stop checks, detokenisation, metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from specray.actors.messages import SeqSpec
from specray.cluster.outputs import CompletionOutput, SpecMetrics
from specray.cluster.params import SamplingParams, choice_seed
from specray.cluster.router.adaptive import Acceptance
from specray.cluster.router.stops import StopTails


DETOKENIZE_PRIMER = 5  # prompt tokens decoded before the first output token's (as vLLM)


@dataclass
class Sequence:
    seq_id: str
    request_id: str
    index: int  # which of the request's n samples
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_model_len: int
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # params.bad_words as token sequences (router/bad_words.py)
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    draft_sent: int = 0  # committed tokens already sent to the draft worker
    draft_known: bool = False  # the draft pool was ever sent this sequence: release it there at the end
    prefilled: int = 0  # prompt tokens the target has cached (chunked prefill: a long prompt takes rounds)
    chunk: int = 0  # prompt tokens this round's target step prefills (set when the round is planned)
    num_cached_tokens: int = 0  # prompt tokens the target took from its prefix cache
    # target features (VerifyResult.features) not sent to the draft worker yet; eagle drafts only
    draft_features: list = field(default_factory=list)
    # incremental detokenisation window over output_token_ids; negative: the prompt's last tokens
    # (set in __post_init__), so the first token's text is what it is after the prompt (its leading space)
    prefix_offset: int = 0
    read_offset: int = 0
    logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float]] | None = None  # the prompt's second token's on, as prefill gives them
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
    acceptance: Acceptance = field(default_factory=Acceptance)  # adaptive lengths (router/adaptive.py)
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    stop_tails: StopTails | None = None  # the text's end a stop string could begin with (streams hold it back)

    def __post_init__(self) -> None:
        assert len(self.prompt_token_ids) >= 1
        self.prefix_offset = -min(DETOKENIZE_PRIMER, len(self.prompt_token_ids))
        if self.params.stop and not self.params.include_stop_str_in_output:
            self.stop_tails = StopTails(self.params.stop)

    def fresh(self) -> "Sequence":
        """The sequence as it was queued: its prompt and parameters, nothing computed (the draft pool
        may still hold it: released at the end all the same)."""
        return Sequence(self.seq_id, self.request_id, self.index, self.prompt_token_ids, self.params,
                        self.eos_token_ids, self.max_model_len, self.bad_words_ids, arrival_time=self.arrival_time,
                        draft_known=self.draft_known)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def prefilling(self) -> bool:
        """The target has not drawn this sequence's first token yet (its prompt is not all cached)."""
        return not self.output_token_ids

    def next_chunk(self, budget: int | None) -> int:
        """Prompt tokens the next step prefills within `budget` (None: the rest of the prompt)."""
        rest = len(self.prompt_token_ids) - self.prefilled
        return rest if budget is None else min(rest, budget)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def spec(self) -> SeqSpec:
        seed = choice_seed(self.params.seed, self.index)
        sampling = replace(self.params.sampling_config(), bad_words_ids=self.bad_words_ids)
        if self.params.min_tokens:  # the tokens that would end the output before it
            eos = frozenset() if self.params.ignore_eos else self.eos_token_ids
            sampling = replace(sampling, min_tokens=self.params.min_tokens,
                               stop_ids=tuple(sorted(eos | set(self.params.stop_token_ids))))
        return SeqSpec(sampling, seed, self.params.logprobs, self.params.prompt_logprobs,
                       prompt_len=len(self.prompt_token_ids), cache_salt=self.params.cache_salt)

    def draft_spec(self) -> SeqSpec:
        """The draft's: the sampling every transport carries (SamplingConfig.for_draft)."""
        spec = self.spec()
        return replace(spec, sampling=spec.sampling.for_draft())

    @property
    def reproducible(self) -> bool:
        """A seeded sampled request: its draws must not depend on anything but its inputs."""
        return self.params.seed is not None and self.params.temperature > 0

    def max_draft_tokens(self) -> int:
        """Draft no more than the round could emit: budget and context length both bound it. A seeded
        sampled request's drafts are bound by the context alone: its last round then draws as a
        longer request's would, so its output is a prefix of that request's, whatever max_tokens."""
        context = self.max_model_len - self.num_tokens - 1
        if self.reproducible:
            return max(0, context)
        return max(0, min(self.params.max_tokens - len(self.output_token_ids) - 1, context))

    def append(self, token_ids: list[int], logprobs: list[dict[int, float]] | None) -> None:
        """Commit emitted tokens one by one, stopping at EOS, stop tokens or the length limits."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        for j, tok in enumerate(token_ids):
            self.output_token_ids.append(tok)
            if logprobs is not None:
                self.logprobs = (self.logprobs or []) + [logprobs[j]]
            if tok in self.eos_token_ids and not self.params.ignore_eos:  # as vLLM: EOS is no stop_reason
                self.finish_reason = "stop"
            elif tok in self.params.stop_token_ids:
                self.finish_reason, self.stop_reason = "stop", tok
            elif len(self.output_token_ids) >= self.params.max_tokens or self.num_tokens >= self.max_model_len:
                self.finish_reason = "length"
            if self.finished:
                return

    def commit(self, token_ids: list[int], logprobs: list[dict[int, float]] | None, tokenizer) -> int:
        """`append` and `detokenize` a round's tokens one at a time, as plain decoding commits them (no
        tokenizer: ids only). So nothing derived from them depends on how many a round emitted: ids,
        usage and logprobs end at the token that completes a stop string, and a round whose last
        token ends inside a multi-byte character still releases the characters before it.
        -> the tokens the output kept (a stop or max_tokens may end it inside the round)."""
        before = len(self.output_token_ids)
        if tokenizer is None:
            self.append(token_ids, logprobs)
            return len(self.output_token_ids) - before
        for j in range(len(token_ids)):
            self.append(token_ids[j:j + 1], None if logprobs is None else logprobs[j:j + 1])
            if not self._stop_token_left_out():
                self.detokenize(tokenizer)
            if self.finished:
                break
        return len(self.output_token_ids) - before

    def _stop_token_left_out(self) -> bool:
        """The token just appended ended the sequence as a stop token (EOS or a stop token id: a
        stop string only finishes it in `detokenize`), whose text vLLM leaves out of the output
        unless include_stop_str_in_output; its id stays in the token ids."""
        return self.finish_reason == "stop" and not self.params.include_stop_str_in_output

    def detokenize(self, tokenizer) -> None:
        """Extend `text` with the newly committed tokens; apply stop strings (cut before the stop
        string unless include_stop_str_in_output)."""
        start, new = len(self.text), self._new_text(tokenizer)
        self.text += new
        if self.stop_tails is not None:
            self.stop_tails.feed(new)
        # as vLLM: the first min_tokens tokens never finish the output, so a stop string counts from
        # the token after them on (it may begin in their text)
        for stop in self.params.stop if len(self.output_token_ids) > self.params.min_tokens else ():
            # a stop string may straddle the old and new text
            at = self.text.find(stop, max(0, start - len(stop) + 1))
            if at >= 0:
                self.text = self.text[: at + (len(stop) if self.params.include_stop_str_in_output else 0)]
                self.finish_reason, self.stop_reason = "stop", stop
                break

    def _new_text(self, tokenizer) -> str:
        """Decode only a short window: text of [prefix_offset:] minus text of [prefix_offset:read_offset].
        Holds back text ending in an incomplete UTF-8 sequence until the next token completes it."""
        skip = self.params.skip_special_tokens
        prefix = tokenizer.decode(self._window(self.prefix_offset, self.read_offset), skip_special_tokens=skip)
        full = tokenizer.decode(self._window(self.prefix_offset, None), skip_special_tokens=skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = max(self.read_offset - 4, 0), len(self.output_token_ids)
        return full[len(prefix):]

    def _window(self, start: int, end: int | None) -> list[int]:
        """Output tokens [start:end]; a negative start takes the prompt's last -start tokens first."""
        head = self.prompt_token_ids[len(self.prompt_token_ids) + start:] if start < 0 else []
        return head + self.output_token_ids[max(start, 0):end]

    def streamable_text(self) -> str:
        """The text no later token can take back: while the sequence runs, a tail that a stop string
        could begin with is held back (a stop string found later cuts there, and a stream must
        never have sent it); finished, all of it."""
        if self.finished or self.stop_tails is None:
            return self.text
        return self.text[: len(self.text) - self.stop_tails.held()]

    def prompt_logprobs_output(self) -> list[dict[int, float] | None] | None:
        """vLLM's prompt_logprobs: None for the first prompt token (nothing predicts it), then one
        dict a prompt token; None where the request asked none."""
        return None if self.prompt_logprobs is None else [None, *self.prompt_logprobs]

    def completion(self) -> CompletionOutput:
        cum = None
        if self.logprobs is not None:
            cum = sum(lp[t] for lp, t in zip(self.logprobs, self.output_token_ids))
        return CompletionOutput(self.index, self.streamable_text(), list(self.output_token_ids), self.finish_reason,
                                self.stop_reason, self.logprobs, cum)

