"""The fused C ops against their torch references, and a model with them against one without."""

import pytest
import torch

from specray.kernels import cpu_ops
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import Checkpoint, load_model

from helpers import save_tiny_llama

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="no C compiler for the CPU ops")


@pytest.mark.parametrize("rows,n", [(1, 64), (3, 576), (5, 37)])
def test_rms_norm_matches_the_reference(rows, n):
    x, w = torch.randn(rows, n) * 3, torch.randn(n)
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-5), cpu_ops.rms_norm_reference(x, w, 1e-5))


def test_add_rms_norm_updates_the_residual_in_place():
    h, delta, w = torch.randn(4, 96), torch.randn(4, 96), torch.randn(96)
    want_h = h + delta
    y = cpu_ops.add_rms_norm(h, delta, w, 1e-6)
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)
    torch.testing.assert_close(y, cpu_ops.rms_norm_reference(want_h, w, 1e-6))


@pytest.mark.parametrize("rows,n", [(1, 1536), (3, 37), (2, 5)])
def test_silu_mul_matches_the_reference(rows, n):
    gate_up = torch.randn(rows, 2 * n) * 4
    torch.testing.assert_close(cpu_ops.silu_mul(gate_up), cpu_ops.silu_mul_reference(gate_up), rtol=2e-6, atol=1e-30)


def test_silu_mul_at_the_extremes():
    gate = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 86.0, -86.0, 88.0, -88.0, 100.0, -100.0,
                         3e38, -3e38, float("inf"), float("nan")])
    gate_up = torch.cat([gate, torch.full_like(gate, 1.5)]).unsqueeze(0)
    got, want = cpu_ops.silu_mul(gate_up), cpu_ops.silu_mul_reference(gate_up)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30, equal_nan=True)
    assert torch.equal(torch.signbit(got), torch.signbit(want))  # -0 stays -0 (silu of a large negative)


def test_silu_mul_is_the_same_arithmetic_for_every_element_and_row():
    """A row's values never depend on the other rows or on where an element falls (a 16-wide vector or
    the padded tail): the fast mode's verification rows equal decode rows bit for bit."""
    gate_up = torch.randn(3, 2 * 37) * 4
    together = cpu_ops.silu_mul(gate_up)
    for r in range(3):
        assert torch.equal(cpu_ops.silu_mul(gate_up[r:r + 1]), together[r:r + 1])
    gate, up = gate_up[:1].chunk(2, dim=-1)
    shifted = cpu_ops.silu_mul(torch.cat([gate[:, 5:], up[:, 5:]], dim=-1))  # tail elements move into vectors
    assert torch.equal(shifted, together[:1, 5:])


@pytest.mark.parametrize("rows,n", [(1, 49152), (16, 8192), (3, 37), (2, 15), (1, 1)])
def test_argmax_rows_is_torch_argmax(rows, n):
    x = torch.randn(rows, n)
    assert torch.equal(cpu_ops.argmax_rows(x), x.argmax(-1))
    assert torch.equal(cpu_ops.argmax_rows(x.t().contiguous().t()), x.argmax(-1))  # strided input


def test_argmax_rows_keeps_torch_ties_nan_and_infinities():
    x = torch.zeros(5, 100)
    x[0, 5] = x[0, 70] = 1.0  # a tie: the first wins
    x[1] = -float("inf")  # all -inf: index 0
    x[2, 80] = x[2, 33] = float("nan")  # a NaN is the maximum: the first NaN
    x[3, 10] = -0.0  # -0 equals 0: the first zero
    x[4, 99] = float("inf")
    assert cpu_ops.argmax_rows(x).tolist() == x.argmax(-1).tolist() == [5, 0, 33, 0, 99]
    half = x.half()  # not fp32: the torch path
    assert torch.equal(cpu_ops.argmax_rows(half), half.argmax(-1))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])  # fp16: the fast mode's cache
def test_rope_store_kv_matches_the_reference(kv_dtype):
    rows, heads, kv_heads, dim, slots_total = 5, 6, 2, 16, 40
    qkv = torch.randn(rows, heads + 2 * kv_heads, dim)
    angles = torch.rand(rows, dim // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [rows, dim]
    slots = torch.tensor([7, 3, 31, 0, 12])
    got_qkv, want_qkv = qkv.clone(), qkv.clone()
    got_kv, want_kv = (torch.zeros(2 * kv_heads, slots_total, dim, dtype=kv_dtype) for _ in range(2))
    cpu_ops.rope_store_kv(got_qkv, cos, sin, slots, got_kv, heads)
    cpu_ops.rope_store_kv_reference(want_qkv, cos, sin, slots, want_kv, heads)
    torch.testing.assert_close(got_qkv, want_qkv)
    torch.testing.assert_close(got_kv, want_kv)
    if kv_dtype == torch.float16:  # rounded to nearest even, as torch's .half() of the same rotated values
        assert torch.equal(got_kv.index_select(1, slots), got_qkv[:, heads:].transpose(0, 1).half())
    assert not torch.equal(got_qkv[:, :heads], qkv[:, :heads])  # it did rotate
    assert torch.equal(got_qkv[:, heads + kv_heads:], qkv[:, heads + kv_heads:])  # values untouched


def test_model_with_fused_ops_matches_the_torch_path(tiny_target):
    plain = load_model(Checkpoint(tiny_target, "t"), cpu_kernels=False)
    fused = load_model(Checkpoint(tiny_target, "t"), cpu_kernels=True)
    assert fused.fused_cpu_ops and not plain.fused_cpu_ops
    outs = []
    for model in (plain, fused):
        cache = model.make_cache(16, block_size=4)
        first = model(RaggedBatch.build([SeqChunk("a", [4, 5, 6, 7, 8], 0, num_logits=5)], cache), cache)
        cache.set_cached("a", 5)
        second = model(RaggedBatch.build([SeqChunk("a", [9, 10], 5, num_logits=2)], cache), cache)
        outs.append((torch.cat([first, second]), cache.kv.clone()))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-4, atol=1e-4)  # the same KV written


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])  # fp16: widened as it is loaded
@pytest.mark.parametrize("head_dim", [16, 20, 64, 80])  # the kernel's 64-float blocks, a remainder, no 16-float block
def test_attention_matches_the_reference_on_a_mixed_batch(tiny_target, tmp_path, head_dim, kv_dtype):
    """Decode, a verification chain and a tree in one step, keys scattered over the paged cache:
    the C attention equals the reference, sequence by sequence (an fp16 cache: the reference on its
    values widened to fp32)."""
    from specray.kernels.attention_reference import reference_attention

    folder = tiny_target if head_dim == 16 else save_tiny_llama(tmp_path, hidden_size=2 * head_dim,
                                                                 num_attention_heads=2, num_key_value_heads=1)
    model = load_model(Checkpoint(folder, "t"), cpu_kernels=False)
    assert model.config.head_dim == head_dim
    c = model.config
    cache = model.make_cache(32, block_size=4)
    for seq, n in (("a", 9), ("b", 3), ("c", 6)):
        model(RaggedBatch.build([SeqChunk(seq, list(range(3, 3 + n)), 0)], cache), cache)
        cache.set_cached(seq, n)
    chunks = [SeqChunk("a", [11], 9), SeqChunk("b", [12, 13, 14, 15], 3, num_logits=4),
              SeqChunk("c", [16, 17, 18, 19, 20], 6, parents=[-1, 0, 0, 1, 2], num_logits=5)]
    batch = RaggedBatch.build(chunks, cache)
    rows = cpu_ops.AttentionRows.build(batch)
    assert rows is not None and rows.new_mask.shape == (10, 5)
    layer_kv = torch.randn_like(cache.kv[0]).to(kv_dtype)
    qkv = torch.randn(batch.num_tokens, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
    got = cpu_ops.attention(qkv, c.num_heads, layer_kv, batch.key_slots, rows, model.scale)
    for b, chunk in enumerate(chunks):
        q0, q1 = batch.cu_seqlens[b], batch.cu_seqlens[b + 1]
        one = RaggedBatch.build([SeqChunk(chunk.seq_id, chunk.token_ids, chunk.context_len, chunk.parents,
                                          num_logits=len(chunk.token_ids))], cache)
        kv = layer_kv.index_select(1, one.key_slots).float()
        want = reference_attention(qkv[q0:q1, : c.num_heads], kv, one, model.scale)
        torch.testing.assert_close(got[q0:q1], want, rtol=1e-5, atol=1e-5)


def chunk_against_decode(model, kv_dtype, rows: int, context: int = 70, parents: list[int] | None = None):
    """-> (the C attention of a step of `rows` new tokens (a chunk, or the tree `parents`) after
    `context` cached ones, each row alone over its visible keys: its context, its ancestors, itself),
    the cache's blocks interleaved with another sequence's."""
    from specray.kernels.attention import ancestor_matrix

    c = model.config
    cache = model.make_cache(96, block_size=4)
    for n in (6, 30, context):  # "a" and "b" take turns for blocks: a's slots are not one run
        for seq in ("a", "b"):
            cache.reserve(seq, n)
    cache.set_cached("a", context)
    gen = torch.Generator().manual_seed(1)
    layer_kv = torch.randn(cache.kv[0].shape, generator=gen).to(kv_dtype)
    qkv = torch.randn(rows, c.num_heads + 2 * c.num_kv_heads, c.head_dim, generator=gen)
    step = RaggedBatch.build([SeqChunk("a", list(range(3, 3 + rows)), context, parents, num_logits=rows)], cache)
    assert cache.slot_run("a", context + rows) is None
    got = cpu_ops.attention(qkv, c.num_heads, layer_kv, step.key_slots, cpu_ops.AttentionRows.build(step), model.scale)
    slots = step.key_slots.tolist()
    visible = ancestor_matrix(parents, rows) if parents else torch.ones(rows, rows).tril().bool()
    alone = []
    for i in range(rows):
        keys = slots[:context] + [slots[context + j] for j in range(rows) if visible[i, j]]
        one = cpu_ops.AttentionRows(*torch.tensor([[0], [len(keys) - 1], [1], [0]]), torch.ones(1, 1, dtype=torch.uint8),
                                    len(keys))
        alone.append(cpu_ops.attention(qkv[i:i + 1], c.num_heads, layer_kv, torch.tensor(keys), one, model.scale)[0])
    return got, torch.stack(alone)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(16, 2, 1), (64, 2, 1), (80, 2, 1), (20, 2, 1), (16, 10, 2)])  # head_dim, heads, kv
@pytest.mark.parametrize("tree", [False, True])
def test_a_steps_rows_read_in_tiles_keep_their_decode_bits(tiny_target, tmp_path, shape, kv_dtype, tree):
    """45 rows after 70 context keys, a prefill chunk or a tree (chains with side branches: rows in
    tiles of several where each extends the one before, siblings apart), read their keys in tiles
    and their values in blocks, and give each row the bits of that row alone over its visible keys.
    Head sizes: the kernel's 16-float blocks, a remainder, none (scalar scores); a GQA group past 4."""
    head_dim, heads, kv_heads = shape
    folder = save_tiny_llama(tmp_path, hidden_size=heads * head_dim, num_attention_heads=heads,
                             num_key_value_heads=kv_heads)
    model = load_model(Checkpoint(folder, "t"), cpu_kernels=False)
    parents = [-1] + [i - 2 if i % 7 == 0 else i - 1 for i in range(1, 45)] if tree else None
    got, alone = chunk_against_decode(model, kv_dtype, 45, parents=parents)
    for i in range(45):
        assert torch.equal(got[i], alone[i]), f"row {i}"


def test_a_prefill_chunk_does_not_take_the_hybrid_split(tiny_target):
    """Past the split's context, a verification-sized step splits (prefix and tree parts merged: close
    to, not the bits of, decoding) while a prefill chunk's rows, more than `c_max_rows`, do not."""
    from specray.kernels.hybrid_attention import hybrid_settings

    model = load_model(Checkpoint(tiny_target, "t"), cpu_kernels=False)
    with hybrid_settings(c_min_context=8, c_min_rows=2, c_max_rows=16):
        got, alone = chunk_against_decode(model, torch.float32, 20)
        assert torch.equal(got, alone)
        got, alone = chunk_against_decode(model, torch.float32, 12)  # split
        assert not torch.equal(got, alone)
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)


def test_prefill_chunks_take_the_c_attention_too(tiny_target):
    model = load_model(Checkpoint(tiny_target, "t"), cpu_kernels=False)
    cache = model.make_cache(32, block_size=4)
    long = RaggedBatch.build([SeqChunk("a", list(range(3, 23)), 0)], cache)  # 20 new tokens
    assert cpu_ops.AttentionRows.build(long).num_ctx.shape == (20,)


def test_padded_keys_are_scored_but_never_seen(tiny_target):
    """The padded baseline's dummy keys (key_pad) cost work but change nothing."""
    model = load_model(Checkpoint(tiny_target, "t"), cpu_kernels=False)
    c = model.config
    cache = model.make_cache(32, block_size=4)
    for seq, n in (("a", 9), ("b", 3)):
        model(RaggedBatch.build([SeqChunk(seq, list(range(3, 3 + n)), 0)], cache), cache)
        cache.set_cached(seq, n)
    layer_kv = torch.randn_like(cache.kv[0])
    outs = []
    for pads in ((0, 0), (0, 6)):
        chunks = [SeqChunk("a", [11, 12], 9, num_logits=2, key_pad=pads[0]),
                  SeqChunk("b", [13, 14], 3, num_logits=2, key_pad=pads[1])]
        batch = RaggedBatch.build(chunks, cache)
        rows = cpu_ops.AttentionRows.build(batch)
        assert rows.num_pad.tolist() == [pads[0]] * 2 + [pads[1]] * 2
        qkv = torch.randn(4, c.num_heads + 2 * c.num_kv_heads, c.head_dim, generator=torch.Generator().manual_seed(0))
        outs.append(cpu_ops.attention(qkv, c.num_heads, layer_kv, batch.key_slots, rows, model.scale))
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
