"""Row-invariant steps (kernels/invariant.py): the same math as the references, and a row's bits do
not depend on the step's other rows, in the precisions that take the torch path."""

import pytest
import torch
import torch.nn.functional as F

from specray import LLM, SamplingParams
from specray.kernels import invariant
from specray.kernels.attention_reference import reference_attention
from specray.kernels.batch import RaggedBatch, SeqChunk, pad_uniform
from specray.kernels.config import ModelConfig
from specray.kernels.kv_cache import PagedKVCache
from specray.kernels.loader import Checkpoint, load_model

CFG = ModelConfig(vocab_size=50, hidden_size=48, intermediate_size=64, num_layers=1, num_heads=6,
                  num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4,
                  max_position_embeddings=256, tie_word_embeddings=True)


def mixed_batch(cache: PagedKVCache) -> RaggedBatch:
    """A prefill, a decode row after 9 keys and a tree after 13, as one step."""
    chunks = [SeqChunk("prefill", list(range(1, 20)), 0), SeqChunk("decode", [3], 9),
              SeqChunk("tree", [4, 5, 6, 7, 8], 13, parents=[-1, 0, 0, 1, 1], num_logits=5)]
    for c in chunks[1:]:
        cache.reserve(c.seq_id, c.context_len)
        cache.set_cached(c.seq_id, c.context_len)
    return RaggedBatch.build(chunks, cache)


@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 40])
def test_chunked_projection_and_norm_match_torch(rows):
    torch.manual_seed(rows)
    x, w, g = torch.randn(rows, 24), torch.randn(40, 24), torch.randn(24)
    torch.testing.assert_close(invariant.linear(x, w), F.linear(x, w))
    torch.testing.assert_close(invariant.rms_norm(x, g, 1e-6), F.rms_norm(x, (24,), g, 1e-6))


def test_visible_keys_are_compacted_in_key_order():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]], dtype=torch.bool)  # a tree's rows
    slots = torch.tensor([7, 8, 20, 21, 22])
    want = torch.tensor([[7, 8, 20, 0, 0], [7, 8, 21, 0, 0], [7, 8, 21, 22, 0]])
    assert torch.equal(invariant.compact(slots, mask), want)


@pytest.mark.parametrize("key_block", [4, 256])  # 4: many blocks a row, the online softmax's merges
def test_attention_matches_the_reference(key_block, monkeypatch):
    monkeypatch.setattr(invariant, "KEY_BLOCK", key_block)
    torch.manual_seed(0)
    cache = PagedKVCache(CFG, num_blocks=16, block_size=5)
    batch = mixed_batch(cache)
    q = torch.randn(batch.num_tokens, CFG.num_heads, CFG.head_dim)
    layer_kv = torch.randn(2 * CFG.num_kv_heads, 16 * 5, CFG.head_dim)
    want = reference_attention(q, layer_kv[:, batch.key_slots], batch, scale=0.3)
    padded = invariant.pad_rows(q, invariant.chunk_rows(q.device))
    got = invariant.attention(padded, layer_kv, invariant.AttentionPlan.build(batch), 0.3)
    torch.testing.assert_close(got[:batch.num_tokens], want, atol=1e-5, rtol=1e-5)


def fresh_caches(model, chunks_list):
    """Each list of chunks with a fresh cache holding a 7-token context for every sequence that has
    context."""
    for chunks in chunks_list:
        cache = model.make_cache(16, block_size=4)
        for seq in {c.seq_id for c in chunks if c.context_len}:
            model(RaggedBatch.build([SeqChunk(seq, [3, 9, 4, 11, 5, 8, 6], 0)], cache), cache)
            cache.set_cached(seq, 7)
        yield chunks, cache


def steps(model, chunks_list):
    """Each list of chunks as one step over `fresh_caches` -> the steps' logits."""
    return [model(RaggedBatch.build(chunks, cache), cache) for chunks, cache in fresh_caches(model, chunks_list)]


@pytest.fixture(scope="module")
def smol_width(tmp_path_factory):
    """Two layers at SmolLM2-135M's widths: where MKL's half-precision kernels vary with the rows."""
    from helpers import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("smol_width"), hidden_size=576, intermediate_size=1536,
                           num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3)


def same_rows(model) -> list[bool]:
    """A decode row against the same row first in a chain, beside another sequence, at the root of a
    tree; the tree's branch against the chain; the chain's rows against decoding every token one row
    at a time (the context too)."""
    one, chain, batched, tree = steps(model, [
        [SeqChunk("b", [12], 7)],
        [SeqChunk("b", [12, 13, 14], 7, num_logits=3)],
        [SeqChunk("a", [30, 31, 32, 33, 34], 7, num_logits=5), SeqChunk("b", [12], 7)],
        [SeqChunk("b", [12, 40, 13], 7, parents=[-1, 0, 0], num_logits=3)]])
    cache = model.make_cache(16, block_size=4)
    rows = []
    for i, t in enumerate([3, 9, 4, 11, 5, 8, 6, 12, 13, 14]):
        if i:
            cache.set_cached("c", i)
        rows.append(model(RaggedBatch.build([SeqChunk("c", [t], i)], cache), cache)[0])
    return [torch.equal(one[0], chain[0]), torch.equal(one[0], batched[5]), torch.equal(one[0], tree[0]),
            torch.equal(chain[1], tree[2])] + [torch.equal(r, chain[i]) for i, r in enumerate(rows[7:])]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_row_does_not_depend_on_the_other_rows(smol_width, dtype, monkeypatch):
    monkeypatch.setattr(invariant, "KEY_BLOCK", 4)  # rows of different key counts span several blocks
    model = load_model(Checkpoint(smol_width, "t"), dtype=dtype)
    assert model.row_invariant
    assert all(same_rows(model))


def test_the_library_path_is_what_the_check_catches(smol_width):
    """Negative control: the same check on the library kernels' path (shapes varying with the step)."""
    model = load_model(Checkpoint(smol_width, "t"), dtype=torch.float16, row_invariant=False)  # a draft's path
    if all(same_rows(model)):
        pytest.skip("this CPU's half-precision kernels happen not to vary with the rows")


def test_fp32_on_cpu_keeps_its_c_kernels_and_fixes_only_the_rest(tiny_target, tiny_gguf_target):
    """The C ops (norms, RoPE, attention, packed weights) are row-invariant as built: an fp32 CPU
    target keeps them (plain fp32 weights pack as they are), and only weights without packed blocks
    take the fixed-row chunks."""
    for folder in (tiny_target, tiny_gguf_target):
        model = load_model(Checkpoint(folder, "t"))
        assert model.row_invariant and model.fused_cpu_ops and not model.gemv_weights
        assert model.decoder_table() is not None
    draft = load_model(Checkpoint(tiny_target, "t"), row_invariant=False, cpu_kernels=False)
    assert draft.gemv_weights  # drafts keep GEMV copies of unpacked weights


@pytest.mark.parametrize("weights", ["f32", "bf16", "unpacked"])
def test_an_fp32_target_from_a_hf_checkpoint_keeps_its_rows(smol_width, weights):
    """MKL's fp32 GEMV (one row) and GEMM (more) sum in different orders. A Hugging Face
    checkpoint's weights pack as their own values (fp32, or bf16 where they are bf16 values) and
    take the C kernels; a target without packed blocks runs its projections in fixed-row chunks."""
    model = load_model(Checkpoint(smol_width, "t"))
    if weights == "bf16":
        with torch.no_grad():
            for w in model.projections():
                w.copy_(w.bfloat16().float())
        model.add_packed_weights()
    if weights == "unpacked":
        model.packed_weights = {}
    assert {p.kind for p in model.packed_weights.values()} == ({weights} if weights != "unpacked" else set())
    assert all(same_rows(model))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_greedy_speculation_equals_plain_in_half_precision(tiny_target, tiny_draft, dtype):
    prompts = [{"prompt_token_ids": [1] + [5 + (i * 7 + j * 3) % 80 for j in range(6 + i)] * 2} for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(tiny_target), dtype=dtype, max_num_seqs=4).generate(prompts, greedy)
    spec = LLM(str(tiny_target), dtype=dtype, max_num_seqs=4,
               speculative_config={"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 3})
    outs = spec.generate(prompts, greedy)
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]


def test_the_fixed_shape_path_is_the_reference_math(tiny_target, monkeypatch):
    """fp32 with the fixed-shape path forced on: the reference's logits, prefill, a chain and a tree
    in one ragged step (only the sums' association differs)."""
    monkeypatch.setattr(invariant, "KEY_BLOCK", 4)
    model = load_model(Checkpoint(tiny_target, "t"), cpu_kernels=False, gemv_weights=False)
    chunks = [[SeqChunk("p", list(range(3, 23)), 0)], [SeqChunk("a", [30, 31, 32], 7, num_logits=3)],
              [SeqChunk("b", [12, 40, 13, 41], 7, parents=[-1, 0, 0, 1], num_logits=4), SeqChunk("c", [5], 7)]]
    model.row_invariant = True
    fixed = steps(model, chunks)
    model.row_invariant = False
    want = [model(RaggedBatch.build(c, cache), cache, reference=True) for c, cache in fresh_caches(model, chunks)]
    for got, ref in zip(fixed, want):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernels", ["exact", "fast"])
def test_greedy_speculation_equals_plain_with_prefills_riding_in_verification_steps(tiny_gguf_target, tiny_draft,
                                                                                   kernels):
    """More prompts than running slots: later prompts' prefills share steps with verification rows
    (steps of 40+ rows), where the CPU kernels must still compute each row as a one-row step would."""
    prompts = [{"prompt_token_ids": [1] + [5 + (i * 11 + j * 7) % 80 for j in range(5 + i % 4)] * 2} for i in range(12)]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = LLM(str(tiny_gguf_target), max_num_seqs=8, kernels=kernels).generate(prompts, greedy)
    spec = LLM(str(tiny_gguf_target), max_num_seqs=8, kernels=kernels,
               speculative_config={"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 4})
    outs = spec.generate(prompts, greedy)
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]


def test_the_padded_baseline_keeps_the_real_rows_bits_on_the_fixed_path(tiny_target):
    """The bench's padded baseline (`pad_uniform`: dummy rows and masked dummy keys up to the
    longest sequence) on the fixed-shape path: the real rows' logits are those of the unpadded step."""
    model = load_model(Checkpoint(tiny_target, "t"), dtype=torch.float16)
    assert model.row_invariant and not model.fused_cpu_ops
    chunks = [SeqChunk("a", [12, 13, 14], 7, num_logits=3), SeqChunk("b", [15], 5)]
    outs = []
    for laid_out in (chunks, pad_uniform(chunks)):
        cache = model.make_cache(16, block_size=4)
        for seq, ctx in (("a", [3, 9, 4, 11, 5, 8, 6]), ("b", [3, 9, 4, 11, 5])):
            model(RaggedBatch.build([SeqChunk(seq, ctx, 0)], cache), cache)
            cache.set_cached(seq, len(ctx))
        outs.append(model(RaggedBatch.build(laid_out, cache), cache))
    assert (pad_uniform(chunks)[1].num_pad, pad_uniform(chunks)[1].key_pad) == (2, 2)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("path", ["every layer in one call", "layer by layer"])
def test_a_target_never_takes_the_hybrid_split(tiny_gguf_target, path):
    """The C attention's hybrid split (a sequence of 3+ rows after a long context) sums the context
    and the round's own keys apart: its rows' bits differ from a one-row step's, and whether a row
    splits follows how many rows its sequence brings. A target (row-invariant) never splits; a draft
    still does, which is also the control that the split applies at these settings."""
    from specray.kernels.hybrid_attention import hybrid_settings

    model = load_model(Checkpoint(tiny_gguf_target, "t"))
    if path == "layer by layer":  # the C attention op per layer (no packed blocks: no decoder table)
        model.packed_weights = {}
    assert model.row_invariant and model.fused_cpu_ops
    assert (model.decoder_table() is not None) == (path == "every layer in one call")
    with hybrid_settings(c_min_context=1):  # the default applies after 2048 keys
        assert all(same_rows(model))
        model.row_invariant = False
        assert not all(same_rows(model))


def test_the_split_rule_is_per_thread(tiny_gguf_target, monkeypatch):
    """The C attention's split rule is set right before each call; a draft stepping on another
    thread of the process (its rule: split) must not change a target's call between the two."""
    import threading

    from specray.kernels import cpu_ops
    from specray.kernels.hybrid_attention import hybrid_settings

    set_rule = cpu_ops.split_rule

    def rule_then_another_thread_flips_it(split: bool) -> None:
        set_rule(split)
        other = threading.Thread(target=set_rule, args=(not split,))
        other.start()
        other.join()

    model = load_model(Checkpoint(tiny_gguf_target, "t"))
    monkeypatch.setattr(cpu_ops, "split_rule", rule_then_another_thread_flips_it)
    with hybrid_settings(c_min_context=1):
        assert all(same_rows(model))


def test_silu_rows_do_not_follow_the_thread_split():
    """At 3+ threads the elements at the end of a thread's part took the scalar exp: rows of a wide
    batch differed from the same rows computed alone."""
    threads = torch.get_num_threads()
    torch.set_num_threads(16)  # any box: torch splits an elementwise op's elements by the thread count
    try:
        gate, up = torch.randn(1120, 5632, generator=torch.Generator().manual_seed(0)).chunk(2, -1)
        assert torch.equal(invariant.silu_mul(gate, up)[:112], invariant.silu_mul(gate[:112], up[:112]))
    finally:
        torch.set_num_threads(threads)
