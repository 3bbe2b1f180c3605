"""How a LlamaModel's weights are laid out for the CPU kernels: packed GGUF blocks in a numeric
mode (exact, fast16 or fast: kernels/kernel_modes.py, kernels/fast_linear.py), transposed copies for one-row MKL steps, the table
the one-call C decoder reads. A mixin of `LlamaModel` (kernels/model.py), which owns the weights."""

from __future__ import annotations

import torch

from specray.kernels import cpu_ops
from specray.kernels.fast_linear import KINDS as FAST_KINDS, FastWeight, pack_fast
from specray.kernels.kernel_modes import FAST_PARTS, check_kernel_mode
from specray.kernels.quant_linear import PackedWeight, kernel_available, pack_exact, round_to_q4_1, round_to_q8_0

ROUNDINGS = {"q8_0": round_to_q8_0, "q4_1": round_to_q4_1}  # what `round_weights` rounds a model to


class CpuWeights:
    """The CPU-kernel view of a model's weights (LlamaModel's attributes: packed_weights,
    gemv_weights, kernel_mode, fused_cpu_ops, native_layers, _decoder_table)."""

    def enable_cpu_kernels(self, mode: str = "exact") -> int:
        """Use the C kernels where they apply (CPU, fp32, a compiled library): fused norms and RoPE,
        and packed weights (`add_packed_weights`) in numeric `mode` ("exact": the fp32 values, what
        transformers computes; "fast": 8-bit activations and integer dot products, a model of its
        own, whose KV cache is fp16: `kv_dtype`; "fast16": the same kernels on two-part, 16-bit
        activations). -> how many weights were packed."""
        check_kernel_mode(mode)
        if self.embed_tokens.device.type != "cpu" or self.dtype != torch.float32 or not cpu_ops.available():
            return 0
        self.fused_cpu_ops, self.kernel_mode = True, mode
        return self.add_packed_weights()

    def pack_weight(self, weight: torch.Tensor) -> PackedWeight | FastWeight | None:
        """The exact blocks of a weight (`pack_exact`), in this model's mode where they are GGUF
        blocks (the fast modes' quantised activations apply to those only); else None."""
        packed = pack_exact(weight.detach())
        fast = packed is not None and self.kernel_mode in FAST_PARTS and packed.kind in FAST_KINDS
        return pack_fast(packed, FAST_PARTS[self.kernel_mode]) if fast else packed

    def add_packed_weights(self) -> int:
        """Keep exact blocks of every projection (`pack_exact`: Q4_1/Q8_0 where the fp32 values came
        from a GGUF file, else 16-bit or fp32 values); steps then read those. -> how many were packed."""
        self.packed_weights = {}
        if not kernel_available():
            return 0
        for w in self.projections():
            packed = self.pack_weight(w)
            if packed is not None:
                self.packed_weights[id(w)] = packed
                self.gemv_weights.pop(id(w), None)  # the packed blocks serve one-row steps
        return len(self.packed_weights)

    def round_weights(self, kind: str = "q8_0", kernels: str = "exact") -> int:
        """Round every projection (and the embedding, if tied to the head) to `kind` blocks (Q8_0 or
        Q4_1 values) in place, then pack them where the C kernels are on, in numeric mode `kernels`:
        the model *becomes* a quantised model, so its reference and packed paths still agree. For
        drafts (see `round_to_q8_0`), which take the fast mode: their numbers only shape proposals.
        -> weights packed."""
        check_kernel_mode(kernels)
        rounding = ROUNDINGS[kind]
        with torch.no_grad():
            for w in self.projections():
                if w.shape[1] % 32 == 0:
                    w.copy_(rounding(w))
        had_gemv, self.gemv_weights = bool(self.gemv_weights), {}  # stale copies of the old values
        packed = 0
        if self.fused_cpu_ops:
            self.kernel_mode = kernels
            packed = self.add_packed_weights()
        if had_gemv:
            self.add_gemv_weights()
        return packed

    def add_gemv_weights(self) -> None:
        """Keep a transposed copy of every projection for one-row steps (batch-1 decode).

        MKL's x @ W^T with W [out, in] runs below x @ Wt with Wt [in, out] contiguous at one row
        (docs/performance.md), while multi-row steps (verification, batches) are fastest in the
        original layout. Costs a second copy of the weights.
        """
        self.gemv_weights = {id(w): w.detach().t().contiguous() for w in self.projections()
                             if id(w) not in self.packed_weights}

    def weight_bytes(self) -> int:
        """Bytes read per decode step: every parameter once (the embedding is a gather, not a read),
        packed weights at their packed size."""
        params = {id(p): p for p in self.parameters()}
        total = sum(self.packed_weights[i].nbytes if i in self.packed_weights else p.numel() * p.element_size()
                    for i, p in params.items())
        if self.lm_head is not self.embed_tokens:
            total -= self.embed_tokens.numel() * self.embed_tokens.element_size()
        return total

    def decoder_table(self) -> cpu_ops.DecoderTable | None:
        """The table `cpu_ops.decoder_layers` runs every layer from, or None where that path does
        not apply: `native_layers` or the C ops off, tensor parallelism (its all-reduces run between
        ops), or a layer projection without packed blocks."""
        if not self.native_layers:
            return None
        built_from, table = self._decoder_table
        if built_from is self.packed_weights:
            return table
        names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        packed = [[self.packed_weights.get(id(getattr(layer, n))) for n in names] for layer in self.layers]
        whole = self.fused_cpu_ops and self.tp_group.size == 1 and all(p for ps in packed for p in ps)
        table = cpu_ops.DecoderTable.build(self.shard_config, self.layers, packed, self.scale) if whole else None
        self._decoder_table = (self.packed_weights, table)
        return table
