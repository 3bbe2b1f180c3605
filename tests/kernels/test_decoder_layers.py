"""Every decoder layer in one C call (`cpu_ops.decoder_layers`) against the op-by-op path and the
pure torch reference, on a model whose weights pack exactly (a dequantised GGUF)."""

import pytest
import torch

from specray.kernels import cpu_ops
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import Checkpoint, load_model

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="no C compiler for the CPU ops")

# decode, a verification chain and a tree in one step
MIXED = [SeqChunk("a", [11], 9), SeqChunk("b", [12, 13, 14, 15], 3, num_logits=4),
         SeqChunk("c", [16, 17, 18, 19, 20], 6, parents=[-1, 0, 0, 1, 2], num_logits=5)]


def prefilled(model):
    cache = model.make_cache(32, block_size=4)
    for seq, n in (("a", 9), ("b", 3), ("c", 6)):
        model(RaggedBatch.build([SeqChunk(seq, list(range(3, 3 + n)), 0)], cache), cache)
        cache.set_cached(seq, n)
    return cache


def step(model, chunks, native: bool, reference: bool = False, features: bool = False):
    """-> (logits, or (logits, features) with `features`; the KV cache after the step) for `chunks`
    after the same prefill."""
    cache = prefilled(model)
    model.native_layers = native
    try:
        logits = model(RaggedBatch.build(chunks, cache), cache, reference=reference, features=features)
    finally:
        model.native_layers = True
    return logits, cache.kv


@pytest.fixture(scope="module")
def packed_model(tiny_gguf_target):
    model = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=True)
    assert model.decoder_table() is not None
    return model


@pytest.fixture(scope="module")
def fast_model(tiny_gguf_target):
    model = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=True, kernels="fast")
    assert model.decoder_table() is not None
    return model


@pytest.fixture(scope="module")
def fast16_model(tiny_gguf_target):
    model = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=True, kernels="fast16")
    assert model.decoder_table() is not None
    return model


@pytest.fixture(scope="module")
def models(packed_model, fast_model, fast16_model):
    return {"exact": packed_model, "fast": fast_model, "fast16": fast16_model}


def test_the_fast_mode_keeps_a_16_bit_cache(packed_model, fast_model, fast16_model):
    assert packed_model.kv_dtype == torch.float32
    for model in (fast_model, fast16_model):
        assert model.kv_dtype == torch.float16 and model.make_cache(4, block_size=4).kv.dtype == torch.float16


@pytest.mark.parametrize("mode", ["fast", "fast16"])
def test_fast_native_layers_match_the_op_by_op_path(models, mode):
    """The fast modes' one-call decoder and their op-by-op path (fast linears, the C attention on the
    fp16 cache) write the same fp16 KV and give the same logits."""
    fast_model = models[mode]
    native, native_kv = step(fast_model, MIXED, native=True)
    loop, loop_kv = step(fast_model, MIXED, native=False)
    assert native_kv.dtype == loop_kv.dtype == torch.float16
    # silu: its own vector exp vs torch's; fast16's second part keeps such last bits (the exact mode's bar)
    tol = 1e-5 if mode == "fast" else 1e-4
    torch.testing.assert_close(native, loop, rtol=tol, atol=tol)
    torch.testing.assert_close(native_kv, loop_kv, rtol=1e-3, atol=1e-3)  # an fp16 ulp where silu moved it


def test_native_layers_match_the_op_by_op_path(packed_model):
    native, native_kv = step(packed_model, MIXED, native=True)
    loop, loop_kv = step(packed_model, MIXED, native=False)
    assert native.shape == (10, packed_model.config.vocab_size)
    torch.testing.assert_close(native, loop, rtol=1e-5, atol=1e-5)  # silu: its own vector exp vs torch's
    torch.testing.assert_close(native_kv, loop_kv, rtol=1e-5, atol=1e-5)  # the same KV written


def test_native_layers_with_the_hybrid_split_match_the_reference(packed_model):
    """The whole-model C call with every round split into the prefix and tree parts (LongSpec's
    hybrid attention) still computes the reference's logits and KV."""
    from specray.kernels.hybrid_attention import ALWAYS_SPLIT, hybrid_settings

    with hybrid_settings(**ALWAYS_SPLIT):
        native, native_kv = step(packed_model, MIXED, native=True)
    ref, ref_kv = step(packed_model, MIXED, native=False, reference=True)
    torch.testing.assert_close(native, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(native_kv, ref_kv, rtol=1e-4, atol=1e-4)


def test_native_layers_match_the_reference(packed_model):
    native, native_kv = step(packed_model, MIXED, native=True)
    ref, ref_kv = step(packed_model, MIXED, native=False, reference=True)
    torch.testing.assert_close(native, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(native_kv, ref_kv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["exact", "fast", "fast16"])  # fast*: quantised activations, the fp16 cache
def test_a_row_does_not_depend_on_the_other_rows(models, mode):
    """A decode row and the first row of a verification chain from the same context give the same
    bits: speculation must not change what the target computes for a token."""
    model = models[mode]
    one, _ = step(model, [SeqChunk("b", [12], 3)], native=True)
    chain, _ = step(model, [SeqChunk("b", [12, 13, 14], 3, num_logits=3)], native=True)
    batched, _ = step(model, [SeqChunk("a", [30, 31], 9, num_logits=2), SeqChunk("b", [12], 3)], native=True)
    tree, _ = step(model, [SeqChunk("b", [12, 40, 41], 3, parents=[-1, 0, 0], num_logits=3)], native=True)
    assert torch.equal(one[0], chain[0]) and torch.equal(one[0], batched[2]) and torch.equal(one[0], tree[0])


def test_the_native_path_applies_only_where_it_can(tiny_target, tiny_gguf_target):
    assert load_model(Checkpoint(tiny_target, "t"), cpu_kernels=False).decoder_table() is None
    assert load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=False).decoder_table() is None
    model = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=True)
    model.native_layers = False
    assert model.decoder_table() is None
    model.native_layers = True
    model.packed_weights.pop(id(model.layers[1].down_proj))
    model.packed_weights = dict(model.packed_weights)  # replaced, as tensor parallelism does
    assert model.decoder_table() is None


def test_prefill_chunks_run_the_one_call_decoder_too(packed_model, monkeypatch):
    """A prefill chunk runs the same C kernels as a decode step: a decode row beside another
    sequence's prefill gets the bits it gets alone."""
    calls = []
    monkeypatch.setattr(cpu_ops, "decoder_layers", lambda *a, **kw: calls.append(a))
    cache = packed_model.make_cache(32, block_size=4)
    packed_model(RaggedBatch.build([SeqChunk("p", list(range(3, 23)), 0)], cache), cache)  # 20 new tokens
    assert len(calls) == 1


@pytest.mark.parametrize("mode", ["exact", "fast", "fast16"])
def test_a_decode_row_beside_a_prefill_keeps_its_bits(models, mode):
    model = models[mode]
    alone, _ = step(model, [SeqChunk("b", [12], 3)], native=True)
    beside, _ = step(model, [SeqChunk("b", [12], 3), SeqChunk("p", list(range(3, 43)), 0)], native=True)
    verify, _ = step(model, [SeqChunk("b", [12] + [13] * 39, 3, num_logits=40)], native=True)
    assert torch.equal(alone[0], beside[0]) and torch.equal(alone[0], verify[0])


@pytest.mark.parametrize("features", [False, True])
@pytest.mark.parametrize("mode", ["exact", "fast", "fast16"])
def test_the_final_norm_and_head_in_one_call_give_the_same_bits(models, mode, features, monkeypatch):
    """A native step's logits (and, for a feature-level draft, every row's final norm) come from
    `decoder_logits` (the final norm and the packed head in one C call) and equal the model's own norm
    and head calls bit for bit."""
    model = models[mode]
    calls = []
    fused_logits = cpu_ops.decoder_logits
    monkeypatch.setattr(cpu_ops, "decoder_logits", lambda *a: calls.append(a) or fused_logits(*a))
    fused, _ = step(model, MIXED, native=True, features=features)
    assert calls and calls[-1][1].shape == (10,)  # the step's ten logits rows (the prefills' before)
    monkeypatch.setattr(model, "packed_head", lambda: None)
    before = len(calls)
    separate, _ = step(model, MIXED, native=True, features=features)
    assert len(calls) == before
    if features:
        assert fused[1].shape == separate[1].shape == (10, model.config.hidden_size)
        assert torch.equal(fused[0], separate[0]) and torch.equal(fused[1], separate[1])
    else:
        assert torch.equal(fused, separate)


def test_packed_weights_take_their_kernel_at_every_step_size(packed_model, fast_model, fast16_model):
    for model in (packed_model, fast_model, fast16_model):
        assert model.packed_head() is not None
        assert all(model.packed_for(w) is not None for w in model.projections())