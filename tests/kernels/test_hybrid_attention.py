"""Hybrid tree attention (LongSpec): the prefix part and the tree part merged by log-sum-exp equal
the reference attention, for random chains, trees and ragged batches, contexts from 1 to beyond a KV
block (and the C kernel's key blocks), odd head counts; in torch and in the C kernel."""

import random

import pytest
import torch

from specray.kernels import cpu_kernels, cpu_ops
from specray.kernels.attention import batch_attention, build_attention_mask, plan_batch_attention, ragged_attention
from specray.kernels.attention_reference import hybrid_reference_attention, reference_attention
from specray.kernels.hybrid_attention import ALWAYS_SPLIT, NEVER_SPLIT, hybrid_settings
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.config import ModelConfig
from specray.kernels.kv_cache import PagedKVCache


def config(num_heads: int, num_kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(vocab_size=50, hidden_size=num_heads * head_dim, intermediate_size=64, num_layers=1,
                       num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, rms_norm_eps=1e-6,
                       rope_theta=1e4, max_position_embeddings=4096, tie_word_embeddings=True)


def random_parents(rng: random.Random, n: int, tree: bool) -> list[int] | None:
    return [-1] + [rng.randrange(i) for i in range(1, n)] if tree else None


def random_batch(rng: random.Random, cache: PagedKVCache, num_seqs: int, max_rows: int, max_ctx: int,
                 min_ctx: int = 1) -> RaggedBatch:
    chunks = []
    for s in range(num_seqs):
        n, ctx = rng.randint(1, max_rows), rng.randint(min_ctx, max_ctx)
        parents = random_parents(rng, n, rng.random() < 0.5)
        cache.reserve(s, ctx)
        cache.set_cached(s, ctx)
        chunks.append(SeqChunk(s, [rng.randrange(50) for _ in range(n)], ctx, parents, num_logits=n))
    rng.shuffle(chunks)
    return RaggedBatch.build(chunks, cache)


SHAPES = [(6, 2, 8), (9, 3, 64), (5, 5, 16), (7, 1, 80)]  # heads, kv heads, head_dim: odd counts, remainders


@pytest.mark.parametrize("seed", range(6))
def test_the_split_reference_is_the_reference(seed):
    rng = random.Random(seed)
    heads, kv_heads, dim = SHAPES[seed % len(SHAPES)]
    cache = PagedKVCache(config(heads, kv_heads, dim), num_blocks=64, block_size=16)
    batch = random_batch(rng, cache, num_seqs=rng.randint(1, 4), max_rows=20, max_ctx=70, min_ctx=0)
    torch.manual_seed(seed)
    q = torch.randn(batch.num_tokens, heads, dim)
    kv = torch.randn(2 * kv_heads, batch.key_slots.shape[0], dim)
    torch.testing.assert_close(hybrid_reference_attention(q, kv, batch, 0.3), reference_attention(q, kv, batch, 0.3),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows,ctx,tree", [(2, 1, False), (4, 17, True), (16, 300, True), (33, 40, False),
                                           (64, 2100, True), (5, 2100, False)])
def test_the_torch_split_matches_the_reference(rows, ctx, tree, monkeypatch):
    """One sequence's round (chain or tree) through `ragged_attention`'s split: the bmm prefix part
    and, past FLASH_MIN_WORK, the fused kernel's."""
    from specray.kernels import attention as attention_module

    calls = []
    split = attention_module.hybrid_attention
    monkeypatch.setattr(attention_module, "hybrid_attention", lambda *a: calls.append(1) or split(*a))
    rng = random.Random(rows * 1000 + ctx)
    heads, kv_heads, dim = 9, 3, 64
    cache = PagedKVCache(config(heads, kv_heads, dim), num_blocks=256, block_size=16)
    cache.reserve("s", ctx)
    cache.set_cached("s", ctx)
    batch = RaggedBatch.build([SeqChunk("s", [1] * rows, ctx, random_parents(rng, rows, tree), num_logits=rows)], cache)
    torch.manual_seed(rows + ctx)
    q = torch.randn(rows, heads, dim)
    kv = torch.randn(2 * kv_heads, ctx + rows, dim)
    with hybrid_settings(**ALWAYS_SPLIT):
        got = ragged_attention(q, kv, build_attention_mask(batch), 0.125, context_len=ctx)
    torch.testing.assert_close(got, reference_attention(q, kv, batch, 0.125), atol=2e-5, rtol=1e-4)
    assert calls == [1]  # the split ran, not the one masked pass


@pytest.mark.parametrize("seed", range(3))
def test_batch_attention_splits_its_single_sequences(seed):
    rng = random.Random(seed)
    cache = PagedKVCache(config(6, 2, 8), num_blocks=64, block_size=16)
    batch = random_batch(rng, cache, num_seqs=4, max_rows=24, max_ctx=150)
    torch.manual_seed(seed)
    q = torch.randn(batch.num_tokens, 6, 8)
    layer_kv = torch.randn(4, 64 * 16, 8)
    with hybrid_settings(**ALWAYS_SPLIT):
        got = batch_attention(q, layer_kv, plan_batch_attention(batch), 0.3)
    torch.testing.assert_close(got, reference_attention(q, layer_kv[:, batch.key_slots], batch, 0.3),
                               atol=1e-5, rtol=1e-5)


def c_attention(batch: RaggedBatch, qkv: torch.Tensor, layer_kv: torch.Tensor, heads: int, split: bool):
    with hybrid_settings(**(ALWAYS_SPLIT if split else NEVER_SPLIT)):
        return cpu_ops.attention(qkv, heads, layer_kv, batch.key_slots, cpu_ops.AttentionRows.build(batch), 0.2)


@pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_the_c_split_matches_the_reference(shape, seed):
    """Ragged steps of chains, trees and decode rows, contexts across the kernel's 64-key blocks and
    several KV blocks, vector tiles that do not divide rows x group."""
    heads, kv_heads, dim = shape
    rng = random.Random(seed)
    cache = PagedKVCache(config(heads, kv_heads, dim), num_blocks=128, block_size=16)
    batch = random_batch(rng, cache, num_seqs=rng.randint(1, 5), max_rows=16, max_ctx=300)
    torch.manual_seed(seed)
    qkv = torch.randn(batch.num_tokens, heads + 2 * kv_heads, dim)
    layer_kv = torch.randn(2 * kv_heads, 128 * 16, dim)
    split = c_attention(batch, qkv, layer_kv, heads, split=True)
    whole = c_attention(batch, qkv, layer_kv, heads, split=False)
    want = reference_attention(qkv[:, :heads], layer_kv[:, batch.key_slots], batch, 0.2)
    torch.testing.assert_close(split, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(whole, want, atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
def test_the_c_split_keeps_rows_independent():
    """A sequence's rows give the same output whatever other sequences share the step."""
    heads, kv_heads, dim = 9, 3, 64
    cache = PagedKVCache(config(heads, kv_heads, dim), num_blocks=64, block_size=16)
    for s, ctx in (("a", 200), ("b", 90)):
        cache.reserve(s, ctx)
        cache.set_cached(s, ctx)
    a = SeqChunk("a", [1, 2, 3, 4, 5], 200, [-1, 0, 0, 1, 2], num_logits=5)
    b = SeqChunk("b", [6, 7, 8], 90, num_logits=3)
    torch.manual_seed(0)
    layer_kv = torch.randn(2 * kv_heads, 64 * 16, dim)
    qkv = torch.randn(8, heads + 2 * kv_heads, dim)
    both = c_attention(RaggedBatch.build([a, b], cache), qkv, layer_kv, heads, split=True)
    alone = c_attention(RaggedBatch.build([a], cache), qkv[:5].contiguous(), layer_kv, heads, split=True)
    assert torch.equal(both[:5], alone)
