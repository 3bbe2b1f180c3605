"""Static decoding with low-confidence remasking: the reference every diffusion decoder must equal.

The canvas is the prompt followed by `gen_length` mask tokens, decoded in semi-autoregressive blocks
of `block_length`. Step t works on block t // steps_per_block: from the logits of the current canvas
it takes each position's candidate (the argmax, or at temperature > 0 a draw from the processed
distribution by inverse CDF at a uniform hashed from (seed, step, position))
and its confidence (the candidate's softmax probability), and unmasks the most confident masked
positions of the block, as many as the step's transfer count (ties: the lower position first).
The mask token is never a candidate. Randomness is a function of (seed, step, position): decoding is
reproducible, and FreeDave can replay any step exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels.sampling import SamplingConfig, processed_probs

_MIX = 0x9E3779B97F4A7C15  # golden-ratio odd constant: spreads (seed, step, position) over 64 bits
_MASK64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    """SplitMix64's finaliser: a well-mixed 64-bit hash of x."""
    x = (x + _MIX) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _unit(h: int) -> float:
    """The top 53 bits of a 64-bit hash as a float in [0, 1)."""
    return (h >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class DecodeOptions:
    """How a diffusion LM decodes: `num_drafts` = 1 is static decoding, K > 1 is FreeDave with K drafts."""

    block_length: int = 32
    steps_per_block: int | None = None  # None: block_length (one token per step)
    num_drafts: int = 1
    adaptive: bool = False  # FreeDave: each sequence's drafts a round chosen up to num_drafts (budget.py)

    def __post_init__(self) -> None:
        _check(isinstance(self.block_length, int) and self.block_length >= 1,
               f"block_length must be an integer >= 1, got {self.block_length!r}")
        spb = self.steps_per_block
        _check(spb is None or (isinstance(spb, int) and 1 <= spb <= self.block_length),
               f"steps_per_block must be an integer in [1, block_length={self.block_length}], got {spb!r}")
        _check(isinstance(self.num_drafts, int) and self.num_drafts >= 1,
               f"num_drafts (FreeDave's K) must be an integer >= 1, got {self.num_drafts!r}")

    @property
    def steps(self) -> int:
        """Steps per block."""
        return self.steps_per_block or self.block_length


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def transfer_counts(block_length: int, steps: int) -> list[int]:
    """Tokens unmasked at each step of a block: as even as possible, the remainder first (LLaDA's rule)."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


@dataclass(frozen=True)
class CanvasPlan:
    """Where one sequence's blocks lie and which step decodes which block."""

    prompt_len: int
    gen_length: int  # a multiple of block_length
    block_length: int
    steps_per_block: int

    def __post_init__(self) -> None:
        assert self.prompt_len >= 1 and self.gen_length >= self.block_length >= 1
        assert self.gen_length % self.block_length == 0, "the canvas holds whole blocks"
        assert 1 <= self.steps_per_block <= self.block_length

    @classmethod
    def for_request(cls, prompt_len: int, max_tokens: int, options: DecodeOptions) -> "CanvasPlan":
        """max_tokens rounded up to whole blocks (the output is cut back to max_tokens)."""
        blocks = -(-max_tokens // options.block_length)
        return cls(prompt_len, blocks * options.block_length, options.block_length, options.steps)

    @property
    def num_steps(self) -> int:
        return self.gen_length // self.block_length * self.steps_per_block

    @property
    def length(self) -> int:
        return self.prompt_len + self.gen_length

    def block(self, step: int) -> tuple[int, int]:
        """Positions [start, end) of the block that `step` decodes."""
        assert 0 <= step < self.num_steps
        start = self.prompt_len + step // self.steps_per_block * self.block_length
        return start, start + self.block_length

    def window(self, first_step: int, num_steps: int) -> tuple[int, int]:
        """Positions of every block that steps [first_step, first_step + num_steps) decode."""
        last = min(first_step + num_steps, self.num_steps) - 1
        return self.block(first_step)[0], self.block(last)[1]

    def transfers(self, step: int) -> int:
        return transfer_counts(self.block_length, self.steps_per_block)[step % self.steps_per_block]

    def finalized_blocks(self, step: int) -> int:
        """Blocks fully decoded once `step` steps have run."""
        return step // self.steps_per_block


@dataclass(frozen=True)
class StepSampler:
    """A sequence's candidate rule: greedy, or Gumbel-max over processed logits with per-step noise."""

    sampling: SamplingConfig
    seed: int  # the request's seed (drawn at admission when it gave none)
    mask_token_id: int

    def uniforms(self, step: int, offsets: torch.Tensor) -> torch.Tensor:
        """U[0, 1) [len(offsets)] (float64) of `step` at those positions of its block: a hash of
        (seed, step, position), so a draw is the same whichever other positions are drawn."""
        return torch.tensor([_unit(_splitmix((self.seed * _MIX + step) * _MIX + o)) for o in offsets.tolist()],
                            dtype=torch.float64)

    def candidates(self, logits: torch.Tensor, step: int,
                   offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [n, vocab_size] at the block positions `offsets` [n] (default 0..n-1) of step's
        block -> candidate [n], confidence [n] (the candidate's softmax probability, fp32)."""
        logits = logits.float().clone()
        logits[:, self.mask_token_id] = float("-inf")
        probs = logits.softmax(-1)  # [n, vocab_size]
        if self.sampling.greedy:
            x0 = logits.argmax(-1)
        else:  # inverse CDF of the processed distribution at the position's uniform
            offsets = torch.arange(logits.shape[0]) if offsets is None else offsets
            cdf = processed_probs(logits, [self.sampling] * logits.shape[0]).double().cumsum(-1)  # [n, vocab]
            point = (self.uniforms(step, offsets) * cdf[:, -1]).unsqueeze(1)  # [n, 1], below each total
            x0 = torch.searchsorted(cdf, point, right=True).squeeze(1).clamp_max(logits.shape[1] - 1)
        return x0, probs.gather(1, x0.unsqueeze(1)).squeeze(1)


class Scores:
    """The logits of one canvas at some positions (its masked ones near the step), and the candidates
    each step takes from them. A position without logits has no candidate (-1, confidence -inf)."""

    def __init__(self, logits: torch.Tensor, positions: torch.Tensor | tuple[int, int], sampler: StepSampler):
        if isinstance(positions, tuple):
            positions = torch.arange(*positions)
        assert logits.shape[0] == positions.shape[0]
        self.positions, self.sampler = positions, sampler  # [n]
        # Greedy candidates do not depend on the step: keep them, not the logits ([n] vs [n, vocab]).
        self.greedy = sampler.candidates(logits, 0) if sampler.sampling.greedy else None
        self.logits = None if self.greedy is not None else logits  # [n, vocab_size]
        self.drawn: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (step, offsets) -> candidates

    def block(self, plan: CanvasPlan, step: int, needed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> candidate [block_length] (-1 where unscored or not `needed` [block_length] bool),
        confidence [block_length] (-inf there). A sampled step's candidates are drawn once per
        (step, positions): drafting and verifying replay the same steps."""
        a, b = plan.block(step)
        inside = (self.positions >= a) & (self.positions < b)
        if needed is not None:
            inside &= needed[(self.positions - a).clamp(0, b - a - 1)]
        offsets = self.positions[inside] - a
        x0 = torch.full((b - a,), -1, dtype=torch.long)
        conf = torch.full((b - a,), float("-inf"))
        if self.greedy is not None:
            x0[offsets], conf[offsets] = self.greedy[0][inside], self.greedy[1][inside]
        elif offsets.numel():
            key = (step, tuple(offsets.tolist()))
            if key not in self.drawn:
                self.drawn[key] = self.sampler.candidates(self.logits[inside], step, offsets)
            x0[offsets], conf[offsets] = self.drawn[key]
        return x0, conf


def masked_positions(canvas: torch.Tensor, window: tuple[int, int], mask_token_id: int) -> torch.Tensor:
    """Positions [n] of `window` still masked in `canvas`: the only ones a step can use logits of."""
    a, b = window
    return a + torch.nonzero(canvas[a:b] == mask_token_id).squeeze(1)


def static_step(canvas: torch.Tensor, scores: Scores, plan: CanvasPlan, step: int, mask_token_id: int) -> torch.Tensor:
    """canvas [length] at `step` -> the canvas after it: the step's most confident masked positions
    of its block take their candidates."""
    a, b = plan.block(step)
    masked = canvas[a:b] == mask_token_id  # [block_length]
    x0, conf = scores.block(plan, step, masked)
    n = plan.transfers(step)
    assert int(masked.sum()) >= n, "a block holds fewer masks than its step unmasks"
    assert bool((x0[masked] >= 0).all()), "a masked position of the step's block was not scored"
    conf = torch.where(masked, conf, torch.full_like(conf, float("-inf")))
    chosen = torch.sort(conf, descending=True, stable=True).indices[:n]
    out = canvas.clone()
    out[a + chosen] = x0[chosen]
    return out


def initial_canvas(prompt_ids: list[int], plan: CanvasPlan, mask_token_id: int) -> torch.Tensor:
    assert len(prompt_ids) == plan.prompt_len
    return torch.tensor(list(prompt_ids) + [mask_token_id] * plan.gen_length, dtype=torch.long)


def static_decode(model, prompt_ids: list[int], plan: CanvasPlan, sampler: StepSampler) -> tuple[torch.Tensor, int]:
    """The reference: one forward per step, each sequence alone. -> (final canvas [length], calls)."""
    mask = sampler.mask_token_id
    canvas = initial_canvas(prompt_ids, plan, mask)
    for step in range(plan.num_steps):
        positions = masked_positions(canvas, plan.block(step), mask)
        logits = model.forward([canvas], [positions])[0]
        canvas = static_step(canvas, Scores(logits, positions, sampler), plan, step, mask)
    assert not bool((canvas[plan.prompt_len:] == mask).any())
    return canvas, plan.num_steps
