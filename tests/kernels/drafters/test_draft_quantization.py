"""Drafts rounded to Q8_0 or Q4_1 (`draft_quantization`): the rounded model is its own reference,
runs the packed C kernels, and drafting with it stays lossless (the verifier uses its probabilities)."""

import pytest
import torch

from specray.cluster.config.speculative import SpeculativeConfig
from specray.kernels import cpu_ops
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.drafters.options import DraftOptions
from specray.kernels.drafters.registry import build_drafter
from specray.kernels.loader import Checkpoint, load_model
from specray import LLM, SamplingParams
from specray.kernels.quant_linear import dequantize, pack_exact, round_to_q4_1, round_to_q8_0

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


@pytest.mark.parametrize("scale", [0.3, 1e-3, 4.0])
def test_q4_1_rounded_weights_pack_exactly_and_stay_close(scale):
    w = torch.randn(48, 96) * scale
    w[0, :32] = 0.25  # a constant block: step 0, every value the minimum
    w[1, 32:64] = torch.linspace(-1, 1, 32) * scale  # the extremes land on q = 0 and q = 15
    r = round_to_q4_1(w)
    packed = pack_exact(r)
    assert packed is not None and packed.kind == "q4_1"
    assert torch.equal(dequantize(packed), r)
    blocks = w.reshape(48, -1, 32)
    step = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 15  # [48, 3, 1]
    err = (r - w).abs().reshape(48, -1, 32)
    # half a step, plus the fp16 rounding of the step (15 steps) and of the minimum
    assert (err <= 0.5 * step + 15 * 2 ** -11 * step + 2 ** -11 * blocks.abs().amax(-1, keepdim=True) + 1e-6).all()
    assert torch.equal(r[0, :32], torch.full((32,), 0.25))
    assert torch.equal(round_to_q4_1(r), r)  # idempotent


@needs_kernels
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_rounded_model_runs_every_layer_natively_and_matches_its_reference(tiny_draft, kind):
    model = load_model(Checkpoint(tiny_draft, "d"))
    kinds = lambda: {p.kind for p in model.packed_weights.values()}  # noqa: E731
    assert kinds() == {"f32"}  # random fp32 weights: packed as they are
    assert model.round_weights(kind) == 4 * len(model.layers) + 1
    assert kinds() == {kind} and model.decoder_table() is not None
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


@needs_kernels
def test_a_q4_1_draft_has_half_the_bytes_and_its_greedy_speculation_equals_plain(tiny_target, tiny_draft):
    """Lossless whatever the draft's blocks: greedy output token for token, chains and VocabTrim."""
    q8 = build_drafter(DraftOptions("draft_model", str(tiny_draft), draft_vocab_trim=0))
    q4 = build_drafter(DraftOptions("draft_model", str(tiny_draft), draft_vocab_trim=0, draft_quantization="q4_1"))
    assert {p.kind for p in q4.model.packed_weights.values()} == {"q4_1"}
    assert q4.model.weight_bytes() < 0.6 * q8.model.weight_bytes()
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in ([1, 17, 40, 23], [1, 5, 9, 9, 9, 9], [1, 30])]
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_target)).generate(prompts, sp)]
    llm = LLM(str(tiny_target), speculative_config={"method": "draft_model", "model": str(tiny_draft),
                                                    "num_speculative_tokens": 3, "draft_quantization": "q4_1"})
    outs = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0


def test_bad_draft_quantization_is_a_clear_error(tiny_draft):
    with pytest.raises(ValueError, match="draft_quantization"):
        SpeculativeConfig(method="draft_model", model=str(tiny_draft), draft_quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        build_drafter(DraftOptions("draft_model", str(tiny_draft), draft_quantization="int4"))
    for method in ("ngram", "aded"):  # no draft model to round: refused, not dropped
        for key, value in (("draft_quantization", "q4_1"), ("draft_vocab_trim", 8), ("draft_num_layers", 1)):
            with pytest.raises(ValueError, match=f"'{key}' shapes a draft model, and method '{method}' has none"):
                SpeculativeConfig(method=method, **{key: value})
