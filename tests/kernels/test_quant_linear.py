"""Packed Q4_1/Q8_0 weights: exact packing, the C kernel against the dequantised reference, and
the packed model against its fp32 self."""

import pytest
import torch
import torch.nn.functional as F

from specray.kernels import quant_linear as ql
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import Checkpoint, load_model

from helpers import gguf_exact

needs_kernel = pytest.mark.skipif(not ql.kernel_available(), reason="no C compiler for the packed kernel")


def exact_weight(kind, out=70, blocks=5, seed=0):
    torch.manual_seed(seed)
    return gguf_exact(torch.randn(out, 32 * blocks), kind)  # [out, 32 * blocks]


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_packing_is_exact_both_ways(kind):
    w = exact_weight(kind)
    packed = ql.pack_exact(w)
    assert packed is not None and packed.kind == kind
    assert packed.blocks.shape == (70, 5, ql.BLOCK_BYTES[kind])
    assert torch.equal(ql.dequantize(packed), w)  # bit for bit


def test_packing_refuses_what_it_cannot_hold_exactly():
    w = exact_weight("q4_1")
    off = w.clone()
    off[3, 7] = torch.nextafter(off[3, 7], torch.tensor(float("inf")))  # one ulp away from the grid
    assert ql.pack_exact(off).kind == "f32"  # no grid holds it: its fp32 values as they are
    assert ql.pack_exact(w[:, :48].contiguous()) is None  # rows not a whole number of blocks
    assert ql.pack_exact(w.half()) is None
    assert ql.pack_exact(w.t()) is None  # not contiguous


def hf_weight(kind, out=70, blocks=5, seed=0):
    """A Hugging Face checkpoint's weight as the CPU loads it: fp32 holding bf16, fp16 or fp32 values."""
    torch.manual_seed(seed)
    w = torch.randn(out, 32 * blocks) * 0.2
    return w if kind == "f32" else w.to(torch.bfloat16 if kind == "bf16" else torch.float16).float()


@pytest.mark.parametrize("kind", ["bf16", "f16", "f32"])
def test_hf_weights_pack_as_their_own_values(kind):
    w = hf_weight(kind)
    packed = ql.pack_exact(w)
    assert packed.kind == kind and packed.blocks.shape == (70, 5, ql.BLOCK_BYTES[kind])
    assert torch.equal(ql.dequantize(packed), w)
    if kind == "f32":  # the weight's own storage, no copy
        assert packed.blocks.data_ptr() == w.data_ptr()


def test_fp16_blocks_keep_subnormals_infinities_and_signed_zeros():
    """The scalar build widens fp16 by bit manipulation: its edge values, through the kernel."""
    special = torch.tensor([0.0, -0.0, 6e-8, -6e-8, 1e-5, 65504.0, -65504.0, 2.0 ** -14, 1.0, 0.5])
    w = torch.cat([special, torch.linspace(-3, 3, 54)]).half().float().view(1, 64)  # [1, 64]
    w = w[:, torch.randperm(64, generator=torch.Generator().manual_seed(1))].contiguous()
    packed = ql.pack_exact(w)
    assert packed.kind == "f16" and torch.equal(ql.dequantize(packed), w)
    infinite = w.clone()
    infinite[0, 3] = float("-inf")
    assert torch.equal(ql.dequantize(ql.pack_exact(infinite)), infinite)
    if ql.kernel_available():
        eye = torch.eye(64)  # row i picks weight i: the widened values themselves
        assert torch.equal(ql.packed_linear(eye, ql.pack_exact(w.expand(8, 64).contiguous()))[:, 0], w[0])


def any_weight(kind, out=70, seed=0):
    return exact_weight(kind, out, seed=seed) if kind.startswith("q") else hf_weight(kind, out, seed=seed)


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "bf16", "f16", "f32"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 8, 9, 17])
def test_kernel_matches_the_dequantised_reference(kind, rows):
    w = any_weight(kind)
    packed = ql.pack_exact(w)
    x = torch.randn(rows, w.shape[1])
    got = ql.packed_linear(x, packed)  # [rows, out]
    want = F.linear(x.double(), w.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got, ql.reference_linear(x, packed), rtol=1e-5, atol=1e-4)


def any_weight_wide(kind, out, blocks):
    torch.manual_seed(1)
    w = torch.randn(out, 32 * blocks) * 0.2
    if kind.startswith("q"):
        return gguf_exact(w, kind)
    return w if kind == "f32" else w.to(torch.bfloat16 if kind == "bf16" else torch.float16).float()


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "bf16", "f16", "f32"])
@pytest.mark.parametrize("blocks", [5, 48])
def test_kernel_rows_do_not_depend_on_batch_or_threads(kind, blocks):
    """A row's output is the same bits whether it runs alone (decode) or among others
    (verification, batches), with 1 or 2 threads. 301 features leave a remainder after every
    feature grouping (4, 3, 2 per call); 13 rows run as a chunk of 8 and one of 5, or (1536 wide)
    in chunks of 4 rows, which keep a chunk's inputs in L1."""
    packed = ql.pack_exact(any_weight_wide(kind, 301, blocks))
    assert packed.kind == kind
    x = torch.randn(13, packed.in_features)
    together = ql.packed_linear(x, packed)
    alone = torch.cat([ql.packed_linear(x[i:i + 1], packed) for i in range(13)])
    assert torch.equal(together, alone)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(ql.packed_linear(x, packed), together)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_packed_model_matches_its_fp32_self(tiny_gguf_target):
    fp32 = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=False)
    packed = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=True)
    assert not fp32.packed_weights and not fp32.fused_cpu_ops and packed.fused_cpu_ops
    assert len(packed.packed_weights) == 1 + 4 * packed.config.num_layers  # every projection + head
    assert packed.weight_bytes() < fp32.weight_bytes() / 3
    outs = []
    for model in (fp32, packed):
        cache = model.make_cache(16, block_size=4)
        chunks = [SeqChunk("a", [4, 5, 6, 7, 8], 0, num_logits=5), SeqChunk("b", [9, 10], 0)]
        first = model(RaggedBatch.build(chunks, cache), cache)  # prefill, 7 rows: packed
        cache.set_cached("a", 5)
        cache.set_cached("b", 2)
        steps = [SeqChunk("a", [11], 5), SeqChunk("b", [12, 13, 14], 2, num_logits=3)]  # decode + verify rows
        outs.append(torch.cat([first, model(RaggedBatch.build(steps, cache), cache)]))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@needs_kernel
def test_the_reference_forward_reads_the_fp32_weights(tiny_gguf_target):
    """reference=True is pure torch even on a packed model: the same bits as the unpacked model."""
    outs = []
    for kernels in (False, True):
        model = load_model(Checkpoint(tiny_gguf_target, "t"), cpu_kernels=kernels)
        cache = model.make_cache(8, block_size=4)
        outs.append(model(RaggedBatch.build([SeqChunk("a", [4, 5, 6], 0, num_logits=3)], cache), cache,
                          reference=True))
    assert torch.equal(outs[0], outs[1])


@needs_kernel
def test_a_bf16_checkpoint_packs_as_bf16_and_speculates_losslessly(tmp_path):
    """A bf16 Hugging Face checkpoint, loaded as fp32 on the CPU: every projection packs as bf16
    blocks (the one-call decoder runs it), and greedy speculation gives plain decoding's tokens."""
    from specray import LLM, SamplingParams

    from helpers import save_tiny_llama

    target = save_tiny_llama(tmp_path / "t", seed=3, bf16=True)
    draft = save_tiny_llama(tmp_path / "d", perturb_from=target, noise=0.3, seed=4)
    model = load_model(Checkpoint(target, "t"))
    assert {p.kind for p in model.packed_weights.values()} == {"bf16"} and model.decoder_table() is not None
    prompts = [{"prompt_token_ids": [1] + [5 + (i * 7 + j * 3) % 80 for j in range(6 + i)] * 2} for i in range(3)]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = LLM(str(target), max_num_seqs=3).generate(prompts, greedy)
    spec = LLM(str(target), max_num_seqs=3, speculative_config={
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}).generate(prompts, greedy)
    assert sum(o.metrics.num_accepted_tokens for o in spec) > 0
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
