"""The "fast" numeric mode of the packed projections: 8-bit activations, integer dot products.

The exact mode (`quant_linear`) computes with the fp32 values of the GGUF blocks, bit for bit the
model transformers runs. The fast mode keeps the same weight blocks but quantises each row's
activations per block of 32 (q = round(x * 127 / amax), d = amax / 127; llama.cpp's Q8
activations) and sums the block's products in int32, which is what makes a CPU decode step
memory-bound and a verification row cheap. It is a different model (outputs close to, not equal to,
the exact mode's) with the same guarantees: a row is quantised and summed alone, so its output
never depends on the other rows of a step, and speculative decoding in this mode is lossless
against plain decoding in this mode.

The fast16 mode (`parts` 2) keeps the layout and the integer dot products but gives each row two
activation parts: its 8-bit quantisation, then the quantisation of what that leaves (x - dx * q),
summed apart and then added. Together they carry about 16 bits of each activation, 250 times less
error than one part (the model's outputs follow the exact mode's: docs/performance.md), at the
integer cost of a second activation row, which a decode step's weight stream hides.

`quantize_activations`, `quantize_two_part` and `reference_linear` (float64 over the same integers) are the
pure torch specification; `fast_linear` runs `csrc/fast_linear.c`, whose AVX-512, AVX2 and scalar paths give
bit-identical outputs (a lane a feature, the same operations in the same order; see the C file).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels import cpu_kernels
from specray.kernels.quant_linear import QK, PackedWeight

TILE = 16  # output features in a tile of the fast layout (one lane each)
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # a feature's block: fp16 scales, as the GGUF blocks store them
KINDS = {"q4_1": 0, "q8_0": 1}
MIN_AMAX = 1e-30  # activation blocks below this quantise to zero (127 / amax would overflow)


@dataclass(frozen=True)
class FastWeight:
    """A weight [out_features, in_features] in the fast layout: tiles of 16 features (the last
    padded with zero blocks), each its blocks in order, a block's 16 features interleaved by 4
    elements (Q4_1: 4 parts of nibble bytes, then 16 fp16 d and 16 fp16 m; Q8_0: 8 parts of
    w + 128, then 16 fp16 d; see csrc/fast_linear.c)."""

    kind: str  # "q4_1" or "q8_0"
    blocks: torch.Tensor  # uint8 [tiles, in_features // 32 * TILE * BLOCK_BYTES[kind]]
    out_features: int
    in_features: int
    parts: int = 1  # activation parts a row: 1 (8-bit: the fast mode), 2 (and its residual: fast16)

    def __post_init__(self):
        assert self.kind in BLOCK_BYTES, self.kind
        assert self.parts in (1, 2)
        assert self.blocks.dtype == torch.uint8 and self.blocks.is_contiguous()
        assert self.in_features > 0 and self.in_features % QK == 0, "rows of whole 32-blocks"
        tiles = -(-self.out_features // TILE)
        assert self.blocks.shape == (tiles, self.in_features // QK * TILE * BLOCK_BYTES[self.kind])

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


def _tiled(x: torch.Tensor, tiles: int, width: int = 4) -> torch.Tensor:
    """[tiles * 16, nb, width * k] bytes of each feature's blocks -> [tiles, nb, width * k * 16]: a
    tile's block as k parts, each `width` bytes of every feature in turn."""
    _, nb, n = x.shape
    return x.reshape(tiles, TILE, nb, n // width, width).permute(0, 2, 3, 1, 4).reshape(tiles, nb, -1)


def _untiled(x: torch.Tensor, width: int = 4) -> torch.Tensor:
    """The inverse of `_tiled`: [tiles, nb, width * k * 16] -> [tiles * 16, nb, width * k]."""
    tiles, nb, n = x.shape
    parts = n // (width * TILE)
    return x.reshape(tiles, nb, parts, TILE, width).permute(0, 3, 1, 2, 4).reshape(tiles * TILE, nb, -1)


def _halves(x: torch.Tensor, tiles: int) -> torch.Tensor:
    """fp32 scales [tiles * 16, nb, 4 bytes] that fp16 holds exactly -> [tiles, nb, 32]: each
    tile's block's 16 fp16 values."""
    return _tiled(x.contiguous().view(torch.float32).half().view(torch.uint8), tiles, width=2)


def pack_fast(packed: PackedWeight, parts: int = 1) -> FastWeight:
    """The fast layout of exact GGUF blocks (the same values: fp16 scales are what GGUF stores),
    run with `parts` activation parts a row."""
    out, nb, n = packed.blocks.shape
    tiles = -(-out // TILE)
    b = torch.zeros(tiles * TILE, nb, n, dtype=torch.uint8)  # padding features: zero blocks
    b[:out] = packed.blocks
    if packed.kind == "q4_1":  # nibble byte j holds elements j and j + 16: part p is bytes 4p..4p+3
        pieces = [_tiled(b[:, :, 8:], tiles), _halves(b[:, :, 0:4], tiles), _halves(b[:, :, 4:8], tiles)]
    else:
        q = (b[:, :, 4:].view(torch.int8).to(torch.int16) + 128).to(torch.uint8)  # [tiles * 16, nb, 32]
        pieces = [_tiled(q, tiles), _halves(b[:, :, 0:4], tiles)]
    body = torch.cat(pieces, dim=-1).reshape(tiles, -1)  # [tiles, nb * 16 * block bytes]
    return FastWeight(packed.kind, body.contiguous(), out, packed.in_features, parts)


def weight_values(fw: FastWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read the fast layout back: -> (integer weights [out, nb, 32] (Q4_1 q in 0..15, Q8_0 signed),
    d [out, nb], m [out, nb] (zero for Q8_0)), all float64."""
    nb = fw.in_features // QK
    tiled = fw.blocks.reshape(fw.blocks.shape[0], nb, -1)  # [tiles, nb, 16 * block bytes]
    at = 256 if fw.kind == "q4_1" else 512  # where the fp16 scales start
    halves = _untiled(tiled[..., at:], width=2).contiguous().view(torch.float16).double()  # [tiles * 16, nb, 1 or 2]
    d = halves[..., 0]  # [tiles * 16, nb]
    if fw.kind == "q4_1":
        nibbles = _untiled(tiled[..., :at])  # [tiles * 16, nb, 16]
        ints = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).double()
        m = halves[..., 1]
    else:
        ints = _untiled(tiled[..., :at]).double() - 128
        m = torch.zeros_like(d)
    out = fw.out_features
    return ints[:out], d[:out], m[:out]


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, in] fp32 -> (q [rows, nb, 32] int8 values as float32, d [rows, nb], s = d * sum(q)
    [rows, nb]): round half to even of x * (127 / amax), clamped to +-127. A block with a non-finite
    value gets d = NaN (its outputs are NaN, as in the exact mode); one below MIN_AMAX is zero."""
    rows, n = x.shape
    xb = x.float().reshape(rows, n // QK, QK)  # [rows, nb, 32]
    amax = xb.abs().amax(-1)  # [rows, nb]
    finite = torch.isfinite(amax)
    live = finite & (amax >= MIN_AMAX)
    inv = torch.where(live, torch.tensor(127.0) / torch.where(live, amax, 1.0), 0.0)  # [rows, nb]
    q = torch.where(live.unsqueeze(-1), (xb * inv.unsqueeze(-1)).round().clamp(-127, 127), 0.0)  # [rows, nb, 32]
    d = torch.where(live, amax / 127, torch.where(finite, 0.0, torch.nan))
    return q, d, d * q.sum(-1)


def quantize_two_part(x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """x [rows, in] fp32 -> the fast16 mode's two parts, each as `quantize_activations` gives it:
    x's, then that of the residual x - d * q rounded once to fp32 (in float64 the product and the
    difference are exact: |q| <= 127, and the residual is at most d / 2)."""
    first = quantize_activations(x)
    q, d, _ = first
    rows, n = x.shape
    residual = x.double().reshape(rows, n // QK, QK) - d.double().unsqueeze(-1) * q.double()  # [rows, nb, 32]
    return [first, quantize_activations(residual.float().reshape(rows, n))]


def reference_linear(x: torch.Tensor, fw: FastWeight) -> torch.Tensor:
    """x [rows, in_features] -> [rows, out_features] float64: sum over blocks of
    dw * dx * (the block's integer dot product) + m * s, over each activation part. The C kernel
    rounds to fp32 on the way (each part's sum, then their sum)."""
    wq, wd, wm = weight_values(fw)
    total = 0.0
    for q, d, s in (quantize_two_part(x) if fw.parts == 2 else [quantize_activations(x)]):
        dots = torch.einsum("rbj,obj->rob", q.double(), wq)  # [rows, out, nb], exact integers
        total = total + (dots * (d.double().unsqueeze(1) * wd.unsqueeze(0))).sum(-1) + s.double() @ wm.T
    return total


# -- the C kernel -----------------------------------------------------------------------------
def fast_linear(x: torch.Tensor, fw: FastWeight) -> torch.Tensor:
    """x [rows, in_features] fp32 -> [rows, out_features] fp32 with the C kernel."""
    lib = cpu_kernels.library()
    if lib is None:
        raise RuntimeError("the fast kernels are unavailable (no C compiler?)")
    assert x.dim() == 2 and x.shape[1] == fw.in_features and x.dtype == torch.float32
    x = x.contiguous()
    rows = x.shape[0]
    act = torch.empty(lib.specray_fast_scratch_bytes(fw.parts * rows, fw.in_features), dtype=torch.uint8)
    y = torch.empty(rows, fw.out_features, dtype=torch.float32)  # [rows, out_features]
    run = lib.specray_fast16_linear if fw.parts == 2 else lib.specray_fast_linear
    run(x.data_ptr(), rows, fw.in_features, fw.blocks.data_ptr(), KINDS[fw.kind], fw.out_features, y.data_ptr(),
        act.data_ptr(), torch.get_num_threads())
    return y
