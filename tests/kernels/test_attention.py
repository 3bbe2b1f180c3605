"""Every attention fast path equals the reference on ragged batches with chains and trees."""

import pytest
import torch

from specray.kernels.attention import build_attention_mask, fused_attention, grouped_attention
from specray.kernels.attention_reference import reference_attention
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.config import ModelConfig
from specray.kernels.kv_cache import PagedKVCache

CFG = ModelConfig(vocab_size=50, hidden_size=48, intermediate_size=64, num_layers=1, num_heads=6,
                  num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4,
                  max_position_embeddings=256, tie_word_embeddings=True)


def ragged_batch(cache):
    chunks = [
        SeqChunk("prefill", list(range(1, 20)), 0),  # 19 rows: a prefill
        SeqChunk("decode", [3], 0),
        SeqChunk("tree", [4, 5, 6, 7, 8], 0, parents=[-1, 0, 0, 1, 1], num_logits=5),
    ]
    for c, ctx in zip(chunks, (0, 9, 13)):  # give the later sequences some context first
        if ctx:
            cache.reserve(c.seq_id, ctx)
            cache.set_cached(c.seq_id, ctx)
            c.context_len = ctx
    return RaggedBatch.build(chunks, cache)


@pytest.mark.parametrize("fast", [grouped_attention, fused_attention])
def test_fast_paths_match_reference(fast):
    torch.manual_seed(0)
    cache = PagedKVCache(CFG, num_blocks=16, block_size=5)
    batch = ragged_batch(cache)
    q = torch.randn(batch.num_tokens, CFG.num_heads, CFG.head_dim)
    kv = torch.randn(2 * CFG.num_kv_heads, batch.key_slots.shape[0], CFG.head_dim)
    want = reference_attention(q, kv, batch, scale=0.3)
    got = fast(q, kv, build_attention_mask(batch), 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_single_decode_row_needs_no_mask():
    cache = PagedKVCache(CFG, num_blocks=4, block_size=4)
    cache.reserve("a", 6)
    cache.set_cached("a", 6)
    batch = RaggedBatch.build([SeqChunk("a", [1], 6)], cache)
    assert build_attention_mask(batch) is None
    assert batch.key_range == (0, 7)  # one run of slots: attention slices the cache, no gather


def test_causal_prefill_skips_the_mask_and_matches_reference():
    from specray.kernels.attention import is_causal_prefill, ragged_attention

    torch.manual_seed(1)
    cache = PagedKVCache(CFG, num_blocks=16, block_size=4)
    batch = RaggedBatch.build([SeqChunk("p", list(range(1, 40)), 0)], cache)
    assert is_causal_prefill(batch) and build_attention_mask(batch) is None
    q = torch.randn(batch.num_tokens, CFG.num_heads, CFG.head_dim)
    kv = torch.randn(2 * CFG.num_kv_heads, batch.num_tokens, CFG.head_dim)
    torch.testing.assert_close(ragged_attention(q, kv, None, 0.3, causal=True),
                               reference_attention(q, kv, batch, 0.3), atol=1e-5, rtol=1e-5)


def decode_batch(cache):
    """Verify-sized rows (<= SMALL_QUERY_ROWS): chains of different lengths and a tree."""
    chunks = [SeqChunk("a", [1], 7), SeqChunk("b", [2, 3, 4], 12),
              SeqChunk("c", [4, 5, 6, 7], 3, parents=[-1, 0, 0, 2], num_logits=4)]
    for c in chunks:
        cache.reserve(c.seq_id, c.context_len)
        cache.set_cached(c.seq_id, c.context_len)
    return RaggedBatch.build(chunks, cache)


def chunked_prefill_batch(cache):
    """A long chunk over earlier context (chunked prefill) beside a decode row."""
    chunks = [SeqChunk("long", list(range(1, 21)), 6), SeqChunk("d", [3], 4)]
    for c in chunks:
        cache.reserve(c.seq_id, c.context_len)
        cache.set_cached(c.seq_id, c.context_len)
    return RaggedBatch.build(chunks, cache)


@pytest.mark.parametrize("make", [ragged_batch, decode_batch, chunked_prefill_batch])
def test_batch_attention_matches_reference(make):
    """Several sequences: each query sees its own keys only, whatever kernel its rows pick."""
    from specray.kernels.attention import batch_attention, plan_batch_attention

    torch.manual_seed(2)
    cache = PagedKVCache(CFG, num_blocks=16, block_size=5)
    batch = make(cache)
    q = torch.randn(batch.num_tokens, CFG.num_heads, CFG.head_dim)
    layer_kv = torch.randn(2 * CFG.num_kv_heads, 16 * 5, CFG.head_dim)  # the cache layer, by slot
    plan = plan_batch_attention(batch)
    got = batch_attention(q, layer_kv, plan, 0.3)
    want = reference_attention(q, layer_kv[:, batch.key_slots], batch, 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all()
    assert all(g.mask.shape[0] > 1 for g in plan.groups)


def test_similar_key_groups_bound_the_padding():
    from specray.kernels.attention import PAD_WASTE, similar_key_groups

    keys = {0: 769, 1: 53, 2: 64, 3: 660, 4: 60, 5: 210, 6: 58, 7: 700}
    groups = similar_key_groups(keys)
    assert sorted(b for g in groups for b in g) == sorted(keys)
    for g in groups:
        assert len(g) * max(keys[b] for b in g) <= PAD_WASTE * sum(keys[b] for b in g)
    assert [0, 7, 3] in groups and len(groups) == 3  # long ones together, short ones together, 210 alone


def test_batch_attention_keeps_the_padded_baseline_masked():
    """The padded baseline's dummy tokens and keys give what the flat block mask gives."""
    from specray.kernels.attention import batch_attention, plan_batch_attention
    from specray.kernels.batch import pad_uniform

    torch.manual_seed(3)
    cache = PagedKVCache(CFG, num_blocks=16, block_size=5)
    chunks = [SeqChunk("a", [1], 7), SeqChunk("b", [2, 3, 4], 12)]
    for c in chunks:
        cache.reserve(c.seq_id, c.context_len)
        cache.set_cached(c.seq_id, c.context_len)
    batch = RaggedBatch.build(pad_uniform(chunks), cache)
    assert batch.key_pads == [5, 0]
    q = torch.randn(batch.num_tokens, CFG.num_heads, CFG.head_dim)
    layer_kv = torch.randn(2 * CFG.num_kv_heads, 16 * 5, CFG.head_dim)
    want = grouped_attention(q, layer_kv[:, batch.key_slots], build_attention_mask(batch), 0.3)
    torch.testing.assert_close(batch_attention(q, layer_kv, plan_batch_attention(batch), 0.3), want,
                               atol=1e-5, rtol=1e-5)


def test_key_range_is_set_exactly_where_the_key_slots_are_one_run():
    """RaggedBatch.build finds the run from the block tables (no tensor pass): the same answer as
    comparing the key slots with an arange, on caches whose free lists were scrambled."""
    import random

    rng = random.Random(0)
    seen = set()
    for _ in range(300):
        cache = PagedKVCache(CFG, num_blocks=40, block_size=2)
        dummies = [f"d{i}" for i in range(rng.randint(0, 4))]
        for d in dummies:
            cache.reserve(d, rng.randint(1, 6))
        for d in rng.sample(dummies, rng.randint(0, len(dummies))):
            cache.free(d)  # the free list now hands out blocks out of order
        chunks = []
        for s in range(rng.randint(1, 3)):
            ctx = rng.randint(0, 6)
            if ctx:
                cache.reserve(s, ctx)
                cache.set_cached(s, ctx)
            chunks.append(SeqChunk(s, [1] * rng.randint(1, 3), ctx, key_pad=rng.choice([0, 0, 0, 2])))
        batch = RaggedBatch.build(chunks, cache)
        keys = batch.key_slots
        first = int(keys[0])
        is_run = bool((keys == torch.arange(first, first + keys.shape[0])).all())
        assert batch.key_range == ((first, first + keys.shape[0]) if is_run else None)
        seen.add(is_run)
    assert seen == {True, False}


@pytest.mark.parametrize("parents", [None, [-1, 0, 0, 1, 1], [-1, -1, 1, 2, 0], [-1, 0, 1, 2, 3]])
def test_visible_new_is_the_ancestor_matrix(parents):
    from specray.kernels.attention import ancestor_matrix
    from specray.kernels.step_masks import visible_new

    n, width = 5, 7
    got = visible_new(parents, n, width)
    assert torch.equal(got[:, :n].bool(), ancestor_matrix(parents, n)) and not got[:, n:].any()


@pytest.mark.parametrize("max_new", [1, 5, 62, 63, 80])
def test_a_steps_new_token_mask_stacks_every_sequences_visible_new(max_new):
    """The whole step's mask at once (ancestry as int bits up to 62 new tokens) equals the reference
    built sequence by sequence: chains, trees, and padded-baseline rows past a tree's parents."""
    from specray.kernels.step_masks import new_token_mask, visible_new

    gen = torch.Generator().manual_seed(max_new)
    parents, counts = [], []
    for b in range(12):
        n = max_new if b == 0 else int(torch.randint(1, max_new + 1, (1,), generator=gen))
        tree = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, n)]
        cut = int(torch.randint(1, n + 1, (1,), generator=gen))  # rows past it: padded-baseline dummies
        parents.append(None if b % 3 == 0 else tree[:cut] if b % 3 == 2 else tree)
        counts.append(n)
    want = torch.cat([visible_new(p, n, max_new) for p, n in zip(parents, counts)])
    got = new_token_mask(parents, counts, max_new)
    assert got.dtype == torch.uint8 and torch.equal(got, want)
