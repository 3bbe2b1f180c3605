"""The "fast" numeric mode of the packed projections: 8-bit activations, integer dot products.

The exact mode (`quant_linear`) computes with the fp32 values of the GGUF blocks, bit for bit the
model transformers runs. The fast mode keeps the same weight blocks but quantises each row's
activations per block of 32 (q = round(x * 127 / amax), d = amax / 127; llama.cpp's Q8
activations) and sums the block's products in int32, which is what makes a CPU decode step
memory-bound and a verification row cheap. It is a different model (outputs close to, not equal to,
the exact mode's) with the same guarantees: a row is quantised and summed alone, so its output
never depends on the other rows of a step, and speculative decoding in this mode is lossless
against plain decoding in this mode.

`quantize_activations` and `reference_linear` (float64 over the same integers) are the pure torch
specification; `fast_linear` runs `csrc/fast_linear.c`, whose AVX-512, AVX2 and scalar paths give
bit-identical outputs (one lane order, see the C file).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels import cpu_kernels
from specray.kernels.quant_linear import QK, PackedWeight

GROUP = 16  # blocks per group of the fast layout (one int32 lane each)
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # fp16 scales, as the GGUF blocks store them
KINDS = {"q4_1": 0, "q8_0": 1}
MIN_AMAX = 1e-30  # activation blocks below this quantise to zero (127 / amax would overflow)
SLACK = 64  # bytes after the last feature: a short last group is read as whole 32-byte vectors


@dataclass(frozen=True)
class FastWeight:
    """A weight [out_features, in_features] in the fast layout: per feature, groups of up to 16
    blocks, each as 4-byte slices of every block (Q4_1: 4 slices of nibble bytes, then fp16 d and m;
    Q8_0: 8 slices of w + 128, then fp16 d; see csrc/fast_linear.c)."""

    kind: str  # "q4_1" or "q8_0"
    blocks: torch.Tensor  # uint8 [out_features, in_features // 32 * BLOCK_BYTES[kind]]
    out_features: int
    in_features: int

    def __post_init__(self):
        assert self.kind in BLOCK_BYTES, self.kind
        assert self.blocks.dtype == torch.uint8 and self.blocks.is_contiguous()
        assert self.in_features > 0 and self.in_features % QK == 0, "rows of whole 32-blocks"
        assert self.blocks.shape == (self.out_features, self.in_features // QK * BLOCK_BYTES[self.kind])
        slack = self.blocks.untyped_storage().nbytes() - self.blocks.storage_offset() - self.blocks.numel()
        assert slack >= SLACK, "fast weights come from pack_fast, which leaves slack after the last feature"

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


def _groups(num_blocks: int) -> list[slice]:
    return [slice(b, min(b + GROUP, num_blocks)) for b in range(0, num_blocks, GROUP)]


def _slices(x: torch.Tensor) -> torch.Tensor:
    """[out, t, 4k] bytes of t blocks -> [out, 4k * t]: slice v of every block, then slice v + 1."""
    out, t, n = x.shape
    return x.reshape(out, t, n // 4, 4).transpose(1, 2).reshape(out, -1)


def _unslice(x: torch.Tensor, t: int) -> torch.Tensor:
    """The inverse of `_slices`: [out, 4k * t] -> [out, t, 4k]."""
    out = x.shape[0]
    return x.reshape(out, -1, t, 4).transpose(1, 2).reshape(out, t, -1)


def _halves(x: torch.Tensor) -> torch.Tensor:
    """fp32 scales [out, t] that fp16 holds exactly -> their fp16 bytes [out, 2t]."""
    return x.contiguous().view(torch.float32).half().view(torch.uint8).reshape(x.shape[0], -1)


def pack_fast(packed: PackedWeight) -> FastWeight:
    """The fast layout of exact GGUF blocks (the same values: fp16 scales are what GGUF stores)."""
    b = packed.blocks  # [out, nb, 24 or 36]
    parts = []
    for g in _groups(b.shape[1]):
        if packed.kind == "q4_1":  # nibble byte j holds elements j and j + 16: slice v is bytes 4v..4v+3
            parts += [_slices(b[:, g, 8:]), _halves(b[:, g, 0:4]), _halves(b[:, g, 4:8])]
        else:
            q = (b[:, g, 4:].view(torch.int8).to(torch.int16) + 128).to(torch.uint8)  # [out, t, 32]
            parts += [_slices(q), _halves(b[:, g, 0:4])]
    body = torch.cat(parts, dim=1)  # [out, nb * block bytes]
    storage = torch.zeros(body.numel() + SLACK, dtype=torch.uint8)  # the AVX2 path reads whole vectors
    storage[: body.numel()] = body.reshape(-1)
    return FastWeight(packed.kind, storage[: body.numel()].view(body.shape), packed.out_features, packed.in_features)


def weight_values(fw: FastWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read the fast layout back: -> (integer weights [out, nb, 32] (Q4_1 q in 0..15, Q8_0 signed),
    d [out, nb], m [out, nb] (zero for Q8_0)), all float64."""
    out = fw.out_features
    ints, ds, ms, at = [], [], [], 0
    for g in _groups(fw.in_features // QK):
        t = g.stop - g.start
        chunk = fw.blocks[:, at: at + t * BLOCK_BYTES[fw.kind]]
        at += chunk.shape[1]
        halves = chunk[:, (16 if fw.kind == "q4_1" else 32) * t:].contiguous().view(torch.float16)  # [out, t or 2t]
        if fw.kind == "q4_1":
            nibbles = _unslice(chunk[:, : 16 * t], t)  # [out, t, 16]
            ints.append(torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).double())
            ms.append(halves[:, t:])
        else:
            ints.append(_unslice(chunk[:, : 32 * t], t).double() - 128)
            ms.append(torch.zeros(out, t, dtype=torch.float16))
        ds.append(halves[:, :t])
    return torch.cat(ints, 1), torch.cat(ds, 1).double(), torch.cat(ms, 1).double()


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


def reference_linear(x: torch.Tensor, fw: FastWeight) -> torch.Tensor:
    """x [rows, in_features] -> [rows, out_features] float64: sum over blocks of
    dw * dx * (the block's integer dot product) + m * s. The C kernel rounds to fp32 on the way."""
    q, d, s = quantize_activations(x)
    wq, wd, wm = weight_values(fw)
    dots = torch.einsum("rbj,obj->rob", q.double(), wq)  # [rows, out, nb], exact integers
    return (dots * (d.double().unsqueeze(1) * wd.unsqueeze(0))).sum(-1) + s.double() @ wm.T


# -- the C kernel -----------------------------------------------------------------------------
def fast_linear(x: torch.Tensor, fw: FastWeight) -> torch.Tensor:
    """x [rows, in_features] fp32 -> [rows, out_features] fp32 with the C kernel."""
    lib = cpu_kernels.library()
    if lib is None:
        raise RuntimeError("the fast kernels are unavailable (no C compiler?)")
    assert x.dim() == 2 and x.shape[1] == fw.in_features and x.dtype == torch.float32
    x = x.contiguous()
    rows = x.shape[0]
    act = torch.empty(lib.specray_fast_scratch_bytes(rows, fw.in_features), dtype=torch.uint8)
    y = torch.empty(rows, fw.out_features, dtype=torch.float32)  # [rows, out_features]
    lib.specray_fast_linear(x.data_ptr(), rows, fw.in_features, fw.blocks.data_ptr(), KINDS[fw.kind],
                            fw.out_features, y.data_ptr(), act.data_ptr(), torch.get_num_threads())
    return y
