"""Drafts rounded to Q8_0 (`draft_quantization`): the rounded model is its own reference, runs the
packed C kernels, and drafting with it stays lossless (the verifier uses its probabilities)."""

import pytest
import torch

from specray.cluster.config.speculative import SpeculativeConfig
from specray.kernels import cpu_ops
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.drafters.options import DraftOptions
from specray.kernels.drafters.registry import build_drafter
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.quant_linear import dequantize, pack_exact, round_to_q8_0

needs_kernels = pytest.mark.skipif(not cpu_ops.available(), reason="no C compiler for the CPU kernels")


def test_rounded_weights_pack_exactly_and_stay_close():
    w = torch.randn(48, 96) * 0.3
    r = round_to_q8_0(w)
    packed = pack_exact(r)
    assert packed is not None and packed.kind == "q8_0"
    assert torch.equal(dequantize(packed), r)
    scale = w.reshape(48, -1, 32).abs().amax(-1, keepdim=True) / 127  # [48, 3, 1] a block's step
    err = (r - w).abs().reshape(48, -1, 32)
    assert (err <= 0.51 * scale * 1.001 + 1e-6).all()  # half a step (plus the fp16 scale's rounding)
    assert torch.equal(round_to_q8_0(r), r)  # idempotent


@needs_kernels
def test_a_rounded_model_runs_every_layer_natively_and_matches_its_reference(tiny_draft):
    model = load_model(Checkpoint(tiny_draft, "d"))
    kinds = lambda: {p.kind for p in model.packed_weights.values()}  # noqa: E731
    assert kinds() == {"f32"}  # random fp32 weights: packed as they are
    assert model.round_weights_to_q8_0() == 4 * len(model.layers) + 1
    assert kinds() == {"q8_0"} and model.decoder_table() is not None
    cache = model.make_cache(16, block_size=4)
    model(RaggedBatch.build([SeqChunk("a", [4, 5, 6, 7], 0)], cache), cache)
    cache.set_cached("a", 4)
    step = [SeqChunk("a", [8, 9, 10], 4, num_logits=3)]
    fast = model(RaggedBatch.build(step, cache), cache)
    ref = model(RaggedBatch.build(step, cache), cache, reference=True)
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)


@needs_kernels
def test_drafts_are_rounded_by_default_on_cpu(tiny_draft):
    rounded = build_drafter(DraftOptions("draft_model", str(tiny_draft), draft_vocab_trim=0))
    kept = build_drafter(DraftOptions("draft_model", str(tiny_draft), draft_vocab_trim=0, draft_quantization="none"))
    assert {p.kind for p in rounded.model.packed_weights.values()} == {"q8_0"}
    assert {p.kind for p in kept.model.packed_weights.values()} == {"f32"}
    w = kept.model.layers[0].qkv_proj
    assert torch.equal(rounded.model.layers[0].qkv_proj, round_to_q8_0(w))


def test_bad_draft_quantization_is_a_clear_error(tiny_draft):
    with pytest.raises(ValueError, match="draft_quantization"):
        SpeculativeConfig(method="draft_model", model=str(tiny_draft), draft_quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        build_drafter(DraftOptions("draft_model", str(tiny_draft), draft_quantization="int4"))
