"""Logit processing and sampling shared by draft and target, so that p and q are comparable.

Randomness comes from `Generators`: either one generator for the whole batch (draws vectorised) or
one per sequence (per-request seeds, reproducible whatever else is in the batch).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

Generators = torch.Generator | list[torch.Generator | None] | None


@dataclass(frozen=True)
class SamplingConfig:
    """Per-sequence processing of target and draft logits."""

    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens below min_p x the most likely one's probability (after temperature)
    # (token id, bias) added to the raw logits: the target's rows before verification (apply_logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] = ()  # only these can be drawn (every other logit -inf); () all
    # read the tokens before a row (kernels/penalties.py): the target's rows, after the bias
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_tokens: int = 0  # before this many output tokens, the stop_ids cannot be drawn (vLLM's min_tokens)
    stop_ids: tuple[int, ...] = ()  # EOS (unless ignore_eos) and the stop token ids
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # token sequences whose last token is not drawn after the rest

    def __post_init__(self) -> None:
        assert self.temperature >= 0.0 and self.top_k >= 0 and 0.0 < self.top_p <= 1.0 and 0.0 <= self.min_p <= 1.0
        assert all(t >= 0 and math.isfinite(b) for t, b in self.logit_bias) and self.repetition_penalty > 0
        assert len({t for t, _ in self.logit_bias}) == len(self.logit_bias), "a token's bias appears once"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def reads_history(self) -> bool:
        """Its rows depend on the tokens before them (penalties, min_tokens): kernels/penalties.py."""
        return self.penalized or (self.min_tokens > 0 and bool(self.stop_ids)) or bool(self.bad_words_ids)

    @property
    def processes_rows(self) -> bool:
        """The target's rows change before verification (kernels/verify/batch.py `_processed_rows`)."""
        return bool(self.logit_bias or self.allowed_token_ids) or self.reads_history

    def for_draft(self) -> "SamplingConfig":
        """What a draft proposes with: temperature, top-k and top-p (what every transport carries).
        The target's other processing only lowers acceptance where a draft ignores it: verification
        takes the draft's probabilities as they are."""
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


# id(ids) -> (ids, their index tensor); the tuple is held, so its id is not reused while cached
_INDEXES: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}
_INDEXES_LOCK = threading.Lock()  # engines on several threads (one LLM each) share it
MAX_INDEXED_IDS = 1 << 20  # ids held at most (the oldest go first): the tuples outlive their requests
MIN_INDEXED_IDS = 1024  # a shorter list is cheap to rebuild


def _index(ids: tuple[int, ...], device) -> torch.Tensor:
    """`ids` as an index tensor, built once per tuple (a sequence's config keeps its own across rounds):
    a list of the whole vocabulary rebuilt for every row of every round cost a round 0.2 s."""
    if len(ids) < MIN_INDEXED_IDS:
        return torch.tensor(ids, dtype=torch.long, device=device)
    with _INDEXES_LOCK:
        hit = _INDEXES.get(id(ids))
        if hit is None or hit[0] is not ids or hit[1].device != torch.device(device):
            while _INDEXES and sum(len(t) for t, _ in _INDEXES.values()) + len(ids) > MAX_INDEXED_IDS:
                _INDEXES.pop(next(iter(_INDEXES)))
            hit = _INDEXES[id(ids)] = (ids, torch.tensor(ids, dtype=torch.long, device=device))
        return hit[1]


def apply_logit_bias(logits: torch.Tensor, configs: list[SamplingConfig]) -> torch.Tensor:
    """logits [rows, vocab_size] (row i uses configs[i]) -> the rows restricted to each config's
    allowed_token_ids, then with its logit_bias added (a copy when any row has either; a greedy
    row's argmax is then the processed one, as vLLM's)."""
    assert logits.shape[0] == len(configs)
    touched = [i for i, c in enumerate(configs) if c.logit_bias or c.allowed_token_ids]
    if not touched:
        return logits
    out = logits.float().clone()
    _keep_allowed(out, [i for i in touched if configs[i].allowed_token_ids], configs)
    biased = [(i, t, b) for i in touched for t, b in configs[i].logit_bias]
    if biased:  # one indexed add for every row's bias (a token appears once in a row's logit_bias)
        rows, ids, bias = zip(*biased)
        out[torch.tensor(rows, device=out.device), torch.tensor(ids, device=out.device)] += torch.tensor(
            bias, dtype=out.dtype, device=out.device)
    return out


def _keep_allowed(out: torch.Tensor, rows: list[int], configs: list[SamplingConfig]) -> None:
    """-inf into out [rows, vocab_size] outside each row's allowed_token_ids: one indexed add per
    distinct id tuple (a request's rows share its config's), not one per row."""
    groups: dict[int, list[int]] = {}
    for i in rows:
        groups.setdefault(id(configs[i].allowed_token_ids), []).append(i)
    for members in groups.values():
        keep = torch.full_like(out[0], float("-inf"))  # [vocab_size]
        keep[_index(configs[members[0]].allowed_token_ids, out.device)] = 0.0
        out[torch.tensor(members, device=out.device)] += keep


def processed_probs(logits: torch.Tensor, configs: list[SamplingConfig]) -> torch.Tensor:
    """logits [rows, vocab_size] (row i uses configs[i]) -> probs [rows, vocab_size] in fp32.

    Greedy rows become one-hot at the argmax, so greedy verification is the same rule on point masses.
    """
    assert logits.shape[0] == len(configs)
    logits = logits.float()
    # float32 cannot hold a temperature below its smallest normal (5e-324 would round to 0 and
    # divide 0 by 0): any such temperature is the same point mass as the smallest normal's
    tiny = torch.finfo(torch.float32).tiny
    temps = torch.tensor([max(c.temperature, tiny) if c.temperature > 0 else 1.0 for c in configs])
    # Shift the row max to 0 before dividing: a tiny temperature then sends the others to -inf (a
    # point mass at the argmax, like greedy) instead of overflowing the max to inf (inf - inf = nan).
    logits = (logits - logits.amax(-1, keepdim=True)) / temps.to(logits.device).unsqueeze(1)
    if any(c.min_p > 0.0 for c in configs):
        logits = _min_p(logits, [c.min_p for c in configs])
    if any(c.top_k > 0 for c in configs):
        logits = _top_k(logits, [c.top_k for c in configs])
    if any(c.top_p < 1.0 for c in configs):
        logits = _top_p(logits, [c.top_p for c in configs])
    probs = logits.softmax(-1)
    greedy = [i for i, c in enumerate(configs) if c.greedy]
    if greedy:
        rows = torch.tensor(greedy, device=logits.device)
        probs[rows] = torch.nn.functional.one_hot(logits[rows].argmax(-1), logits.shape[1]).float()
    return probs


def _min_p(logits: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Drop tokens whose probability is below min_p x the row's largest (the argmax always stays).
    The rows' max is 0 here, so that is a logit below log(min_p)."""
    floor = torch.tensor([math.log(p) if p > 0 else -math.inf for p in ps], device=logits.device).unsqueeze(1)
    return logits.masked_fill(logits < floor, float("-inf"))


def _top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    vocab = logits.shape[1]
    k = torch.tensor([kk if 0 < kk < vocab else vocab for kk in ks], device=logits.device)
    kth = logits.topk(int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))  # [rows, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits: torch.Tensor, ps: list[float]) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    top_p = torch.tensor(ps, device=logits.device).unsqueeze(1)
    # Drop a token when the mass before it already reaches top_p; the first token always stays (a
    # top_p below float32's smallest value rounds to 0, which the rule alone would let drop it too).
    drop_sorted = ((cum - sorted_logits.softmax(-1)) >= top_p) & (top_p < 1.0)  # a row without top_p keeps its
    drop_sorted[:, 0] = False  # tail, whose running sum rounds to 1.0 in float32, whatever its batch's rows ask
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def uniforms(counts: list[int], generators: Generators, device="cpu") -> torch.Tensor:
    """[sum(counts)] float64 U(0, 1) draws; sequence i's `counts[i]` draws come from its own generator.
    float64: float32's 24-bit uniforms drew a token under 2^-24 with probability 0 or 2^-24, and
    quantised the acceptance test the same way."""
    total = sum(counts)
    if not isinstance(generators, list):
        gen_device = device if generators is None else generators.device
        return torch.rand(total, generator=generators, device=gen_device, dtype=torch.float64).to(device)
    # A seeded sequence draws on its generator's device (the host), so its draws are the same
    # whether the model runs on CPU or GPU; one small copy per round.
    parts = [torch.rand(n, generator=g, device=device if g is None else g.device, dtype=torch.float64).to(device)
             for n, g in zip(counts, generators, strict=True)]
    return torch.cat(parts) if parts else torch.empty(0, device=device, dtype=torch.float64)


def sample_rows(probs: torch.Tensor, generators: Generators) -> torch.Tensor:
    """probs [rows, vocab_size] (unnormalised is fine) -> one token per row [rows].

    Inverse CDF with one uniform per row: a float64 cumulative sum and a binary search. Exact like
    torch.multinomial, and much faster on a large vocabulary (docs/performance.md).
    Zero-probability tokens are never drawn: their CDF step has zero width.
    """
    rows, vocab = probs.shape
    if rows == 0:
        return torch.empty(0, dtype=torch.long, device=probs.device)
    u = uniforms([1] * rows, generators, device=probs.device)  # [rows] float64
    cdf = probs.double().cumsum(-1)  # [rows, vocab_size]
    point = (u * cdf[:, -1]).unsqueeze(1)  # [rows, 1], strictly below the total since u < 1
    return torch.searchsorted(cdf, point, right=True).squeeze(1).clamp_max(vocab - 1)
