"""Linear layers over weights kept exactly as blocks of 32: GGUF Q4_1 / Q8_0, or plain bf16, fp16
or fp32 values (CPU path).

A batch-1 decode step reads every weight once, so its speed is bytes read over memory bandwidth.
SmolLM2-135M ships as Q4_1 (Q8_0 embedding), and its dequantised fp32 weights are exactly
d * q + m per block of 32. Packing recovers (d, m, q) from the fp32 tensor and keeps it only if
every value comes back bit for bit, so the packed model *is* the fp32 model (no re-quantisation,
activations stay fp32), read in 24 or 36 bytes per 32 weights instead of 128. A Hugging Face
checkpoint's weights (bf16 or fp16 values widened to fp32, or fp32 ones) pack as 16-bit or fp32
blocks the same way: every target projection then runs this kernel, whose rows do not depend on
the step (MKL's GEMV and GEMM round a row differently; kernels/invariant.py).

`dequantize` + `F.linear` is the pure torch reference; `packed_linear` runs the C kernel in
`csrc/quant_linear.c` (built by `cpu_kernels`). Without a compiler the model keeps its fp32 path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specray.kernels import cpu_kernels

QK = 32  # weights per block
# fp32 d (+ fp32 m for q4_1; GGUF fp16 values) then q; or the 32 values themselves
BLOCK_BYTES = {"q4_1": 24, "q8_0": 36, "bf16": 64, "f16": 64, "f32": 128}
KINDS = {"q4_1": 0, "q8_0": 1, "f32": 2, "bf16": 3, "f16": 4}  # csrc/quant_linear.c's codes
PLAIN = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}  # kinds that are the values themselves


@dataclass(frozen=True)
class PackedWeight:
    """A weight [out_features, in_features] as blocks [out_features, in_features / 32, block bytes]."""

    kind: str  # a key of BLOCK_BYTES
    blocks: torch.Tensor  # uint8 [out_features, in_features // 32, BLOCK_BYTES[kind]]; for "f32" a view of the weight
    out_features: int
    in_features: int

    def __post_init__(self):
        assert self.kind in BLOCK_BYTES, self.kind
        assert self.blocks.dtype == torch.uint8 and self.blocks.is_contiguous()
        assert self.in_features > 0 and self.in_features % QK == 0, "rows of whole 32-blocks"
        assert self.blocks.shape == (self.out_features, self.in_features // QK, BLOCK_BYTES[self.kind])

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


# -- packing (exact or nothing) ---------------------------------------------------------------
def pack_exact(weight: torch.Tensor) -> PackedWeight | None:
    """The smallest packing of a CPU fp32 weight [out, in] (in % 32 == 0) that holds its values
    exactly: Q4_1, Q8_0, bf16, fp16, else its fp32 values as they are; None for other weights."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    if weight.shape[1] % QK or not weight.is_contiguous():
        return None
    w = weight.detach().reshape(weight.shape[0], -1, QK)  # [out, nb, 32]
    finite = bool(torch.isfinite(w).all())
    for pack in (_pack_q4_1, _pack_q8_0) if finite else ():
        packed = pack(w)
        if packed is not None:
            return packed
    return _pack_16(w) or _pack_f32(weight.detach())


def _pack_16(w: torch.Tensor) -> PackedWeight | None:
    for kind in ("bf16", "f16"):
        narrow = w.to(PLAIN[kind])  # [out, nb, 32]
        if torch.equal(narrow.float(), w):  # (never with a NaN: NaN != NaN)
            return PackedWeight(kind, narrow.view(torch.uint8).contiguous(), w.shape[0], w.shape[1] * QK)
    return None


def _pack_f32(weight: torch.Tensor) -> PackedWeight:
    """The weight's own storage as blocks: no copy (in-place updates of the weight show through)."""
    out, inp = weight.shape
    return PackedWeight("f32", weight.view(torch.uint8).view(out, inp // QK, BLOCK_BYTES["f32"]), out, inp)


def _q4_1_parts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, nb, 32] -> the nearest Q4_1 blocks' step d, minimum m [out, nb, 1] (fp16 values as fp32)
    and q [out, nb, 32] in 0..15: the value of element j is d * q_j + m."""
    m = w.amin(-1, keepdim=True).half().float()  # the block minimum is q = 0
    d = ((w.amax(-1, keepdim=True) - m) / 15).half().float()  # q = 15 at the maximum
    q = torch.where(d > 0, (w - m) / torch.where(d > 0, d, 1), 0).round().clamp(0, 15)
    return d, m, q


def _pack_q4_1(w: torch.Tensor) -> PackedWeight | None:
    d, m, q = _q4_1_parts(w)
    if not torch.equal(d * q + m, w):  # not Q4_1 values (an m off fp16 included)
        return None
    q = q.to(torch.uint8)
    nibbles = q[..., :16] | (q[..., 16:] << 4)  # element j low, j + 16 high (the ggml order)
    blocks = torch.cat([d.view(torch.uint8), m.view(torch.uint8), nibbles], dim=-1)
    return PackedWeight("q4_1", blocks.contiguous(), w.shape[0], w.shape[1] * QK)


def _pack_q8_0(w: torch.Tensor) -> PackedWeight | None:
    d = (w.abs().amax(-1, keepdim=True) / 127).half().float()  # [out, nb, 1]
    q = torch.where(d > 0, w / torch.where(d > 0, d, 1), 0).round()
    if q.abs().amax() > 127 or not torch.equal(d * q, w):
        return None
    blocks = torch.cat([d.view(torch.uint8), q.to(torch.int8).view(torch.uint8)], dim=-1)
    return PackedWeight("q8_0", blocks.contiguous(), w.shape[0], w.shape[1] * QK)


def round_to_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """The values of weight [out, in] (in % 32 == 0) rounded to Q8_0 blocks (fp16 scale, int8), as
    fp32: what `pack_exact` then packs bit for bit. For drafts, whose weights only shape proposals:
    verification uses the draft's own probabilities, so a rounded draft stays lossless."""
    assert weight.dim() == 2 and weight.shape[1] % QK == 0, "Q8_0 rounds rows of whole 32-blocks"
    w = weight.detach().float().reshape(weight.shape[0], -1, QK)  # [out, nb, 32]
    d = (w.abs().amax(-1, keepdim=True) / 127).half().float()  # [out, nb, 1]
    q = torch.where(d > 0, w / torch.where(d > 0, d, 1), 0).round().clamp(-127, 127)
    return (d * q).reshape(weight.shape)


def round_to_q4_1(weight: torch.Tensor) -> torch.Tensor:
    """The values of weight [out, in] (in % 32 == 0) rounded to Q4_1 blocks (fp16 step d and minimum
    m, 4-bit q; value d * q + m), as fp32: what `pack_exact` then packs bit for bit. Half the bytes of
    Q8_0, for drafts (see `round_to_q8_0`)."""
    assert weight.dim() == 2 and weight.shape[1] % QK == 0, "Q4_1 rounds rows of whole 32-blocks"
    d, m, q = _q4_1_parts(weight.detach().float().reshape(weight.shape[0], -1, QK))
    return (d * q + m).reshape(weight.shape)


def dequantize(packed: PackedWeight) -> torch.Tensor:
    """The fp32 weight [out_features, in_features] the blocks hold (the reference)."""
    b = packed.blocks
    if packed.kind in PLAIN:
        return b.view(PLAIN[packed.kind]).float().reshape(packed.out_features, packed.in_features)
    d = b[..., 0:4].contiguous().view(torch.float32)  # [out, nb, 1]
    if packed.kind == "q8_0":
        q = b[..., 4:].contiguous().view(torch.int8).float()  # [out, nb, 32]
        w = d * q
    else:
        m = b[..., 4:8].contiguous().view(torch.float32)
        nibbles = b[..., 8:]  # [out, nb, 16]
        q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).float()  # [out, nb, 32]
        w = d * q + m
    return w.reshape(packed.out_features, packed.in_features)


def reference_linear(x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
    """x [rows, in_features] -> [rows, out_features] through the dequantised weight."""
    return F.linear(x, dequantize(packed))


# -- the C kernel -----------------------------------------------------------------------------
def kernel_available() -> bool:
    return cpu_kernels.available()


def packed_linear(x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
    """x [rows, in_features] fp32 -> [rows, out_features] with the C kernel (see module doc)."""
    lib = cpu_kernels.library()
    if lib is None:
        raise RuntimeError("the packed-weight kernel is unavailable (no C compiler?); use reference_linear")
    assert x.dim() == 2 and x.shape[1] == packed.in_features and x.dtype == torch.float32
    x = x.contiguous()
    y = torch.empty(x.shape[0], packed.out_features, dtype=torch.float32)  # [rows, out_features]
    lib.specray_exact_linear(x.data_ptr(), x.shape[0], packed.in_features, packed.blocks.data_ptr(),
                             KINDS[packed.kind], packed.out_features, y.data_ptr(), torch.get_num_threads())
    return y
