"""Prefix caching's block bookkeeping (kernels/prefix_cache.py, PagedKVCache.match_prefix): exact cases."""

import pytest
import torch

from specray.kernels.config import ModelConfig
from specray.kernels.kv_cache import OutOfBlocksError, PagedKVCache
from specray.kernels.prefix_cache import ROOT, BlockPool, block_digest

CONFIG = ModelConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=4, rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=64,
                     tie_word_embeddings=True)


def cache(num_blocks=8, caching=True) -> PagedKVCache:
    return PagedKVCache(CONFIG, num_blocks, block_size=4, prefix_caching=caching)


def computed(c: PagedKVCache, seq, tokens: list[int]) -> None:
    """What a worker's step does for `seq`: slots for the tokens past the cached ones, all cached after."""
    c.reserve(seq, len(tokens))
    c.set_cached(seq, len(tokens))
    c.register_blocks(seq, tokens)


def test_a_digest_names_the_whole_prefix():
    a = block_digest(ROOT, [1, 2, 3, 4])
    assert a == block_digest(ROOT, [1, 2, 3, 4]) and len(a) == 16
    assert block_digest(a, [5, 6, 7, 8]) != block_digest(block_digest(ROOT, [9, 2, 3, 4]), [5, 6, 7, 8])
    assert block_digest(ROOT, [1, 2, 3, 4]) != block_digest(ROOT, [1, 2, 3, 5])
    assert block_digest(ROOT, [256]) != block_digest(ROOT, [1, 0])  # four bytes a token: no ambiguity


def test_a_second_sequence_takes_the_first_ones_full_blocks_and_computes_the_rest():
    c = cache()
    computed(c, "a", list(range(10)))  # blocks [0..3], [4..7] full; [8, 9] partial: not offered
    a_blocks = list(c.tables["a"].blocks)
    tokens = list(range(8)) + [50, 51, 52]
    assert c.match_prefix("b", tokens, len(tokens) - 1) == 8
    assert c.tables["b"].blocks == a_blocks[:2] and c.num_cached("b") == 8
    assert c.pool.refs[a_blocks[0]] == 2 and c.pool.stats.hit_tokens == 8
    c.reserve("b", len(tokens))
    assert c.tables["b"].blocks[2] not in a_blocks  # its own third block


def test_the_limit_keeps_the_last_prompt_token_computed():
    c = cache()
    computed(c, "a", list(range(8)))
    assert c.match_prefix("b", list(range(8)), 7) == 4  # the second block holds token 7, which must draw
    assert c.match_prefix("c", list(range(8)), 8) == 8


def test_a_mismatch_stops_the_match_and_later_blocks_never_match_out_of_place():
    c = cache()
    computed(c, "a", list(range(12)))
    assert c.match_prefix("b", [0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12], 12) == 4
    # b's third block holds a's third block's tokens, after a different second: a different prefix
    assert c.match_prefix("c", [9, 9, 9, 9, 4, 5, 6, 7], 8) == 0


def test_only_a_sequence_whose_every_block_so_far_was_found_matches():
    c = cache()
    computed(c, "a", list(range(8)))
    computed(c, "b", [7, 7, 7, 7])  # computed its first block itself
    assert c.match_prefix("b", [7, 7, 7, 7, 4, 5, 6, 7, 1], 8) == 0


def test_freed_blocks_stay_cached_until_a_new_block_needs_them_least_recently_freed_first():
    c = cache(num_blocks=4)
    computed(c, "a", list(range(8)))
    computed(c, "b", [9] * 8)
    c.free("a")
    c.free("b")
    assert c.num_free_blocks == 4 and not c.pool.free and len(c.pool.evictable) == 4
    # a's blocks went first (its last block before its first): taking two evicts them
    c.reserve("c", 8)
    assert c.match_prefix("d", list(range(8)) + [1], 8) == 0
    assert c.match_prefix("e", [9] * 8 + [1], 8) == 8


def test_a_shared_block_is_never_handed_out_while_a_sequence_uses_it():
    c = cache(num_blocks=3)
    computed(c, "a", list(range(8)))
    assert c.match_prefix("b", list(range(8)) + [1], 8) == 8
    c.free("a")  # b still holds both
    assert c.num_free_blocks == 1
    c.reserve("c", 4)
    with pytest.raises(OutOfBlocksError):
        c.reserve("d", 4)
    c.free("b")
    assert c.num_free_blocks == 2


def test_restore_gives_the_hits_and_the_reserved_blocks_back():
    c = cache()
    computed(c, "a", list(range(8)))
    c.match_prefix("b", list(range(8)) + [1], 8)
    c.reserve("b", 9)  # the failed step's own block
    c.restore("b", 0, 0, 0)
    assert c.num_cached("b") == 0 and c.tables["b"].blocks == [] and c.tables["b"].digests == []
    assert c.pool.refs[c.tables["a"].blocks[0]] == 1 and c.num_free_blocks == 6
    assert c.match_prefix("b", list(range(8)) + [1], 8) == 8  # the retried step finds them again


def test_a_digest_registered_twice_keeps_its_first_block():
    c = cache()
    computed(c, "a", [1, 2, 3, 4])
    computed(c, "b", [1, 2, 3, 4])  # the same prompt computed beside it, in the same step
    assert c.pool.by_digest[block_digest(ROOT, [1, 2, 3, 4])] == c.tables["a"].blocks[0]
    c.free("b")
    assert c.tables["a"].blocks[0] not in c.pool.evictable and len(c.pool.free) == 7


def test_without_caching_nothing_is_registered_or_found():
    c = cache(caching=False)
    computed(c, "a", list(range(8)))
    assert c.match_prefix("b", list(range(8)) + [1], 8) == 0 and not c.pool.by_digest
    c.free("a")
    assert len(c.pool.free) == 8 and not c.pool.evictable


def test_the_pool_refuses_what_it_does_not_have():
    pool = BlockPool(2, caching=True)
    assert pool.take(2) == [0, 1]
    with pytest.raises(OutOfBlocksError):
        pool.take(1)
    with pytest.raises(AssertionError):
        pool.give_back([0, 0])


def test_a_fresh_copy_replaces_an_unused_registered_block():
    """A sequence that computes blocks already cached (it needed every row) keeps its copies cached:
    an unused original gives way to the copy, which its sequence protects from eviction."""
    c = cache()
    computed(c, "a", list(range(8)))
    originals = list(c.tables["a"].blocks)
    c.free("a")
    computed(c, "b", list(range(8)))  # computed again, not matched
    assert [c.pool.by_digest[d] for d in c.tables["b"].digests] == c.tables["b"].blocks
    assert all(block in c.pool.free and block not in c.pool.digest_of for block in originals)
    c.free("b")
    assert c.match_prefix("d", list(range(8)) + [1], 8) == 8


def test_a_private_copy_is_registered_when_its_sequence_ends_if_the_original_is_gone():
    c = cache(num_blocks=5)
    computed(c, "a", [1, 2, 3, 4])
    computed(c, "b", [1, 2, 3, 4])  # beside a, which uses the original: b's copy stays private
    c.free("a")
    c.reserve("filler", 16)  # takes the free blocks, then evicts a's original
    assert not c.pool.by_digest
    c.free("b")
    assert c.match_prefix("d", [1, 2, 3, 4, 9], 4) == 4


def test_features_kept_beside_the_kv_serve_only_the_blocks_that_hold_them():
    c = cache(num_blocks=8)
    tokens = list(range(10))
    c.reserve("a", 10)
    rows = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)  # [tokens, width]
    c.write_features("a", 0, rows)
    c.set_cached("a", 10)
    c.register_blocks("a", tokens, with_features=True)
    assert c.featured == set(c.tables["a"].blocks[:2])  # the partial block is not offered
    assert c.match_prefix("b", tokens, 9, with_features=True) == 8
    assert torch.equal(c.read_features("b", 0, 8), rows[:8])
    computed(c, "x", [40 + i for i in range(8)])  # blocks without features
    assert c.match_prefix("y", [40 + i for i in range(8)] + [1], 8, with_features=True) == 0
    assert c.match_prefix("z", [40 + i for i in range(8)] + [1], 8) == 8
    for seq in ("a", "b", "x", "y", "z"):
        c.free(seq)
    c.reserve("w", 32)  # every block: the cached ones are evicted, and their features with them
    assert not c.featured
    with pytest.raises(AssertionError, match="features"):
        c.write_features("w", 0, torch.zeros(2, 5))


def test_blocks_are_shared_only_between_sequences_of_the_same_salt():
    c = cache()
    c.salt("a", "tenant-1")
    computed(c, "a", list(range(9)))
    tokens = list(range(9))
    assert c.match_prefix("plain", tokens, 8) == 0  # neither way: an unsalted sequence ...
    c.salt("other", "tenant-2")
    assert c.match_prefix("other", tokens, 8) == 0  # ... nor another salt takes a salted block
    c.salt("same", "tenant-1")
    assert c.match_prefix("same", tokens, 8) == 8 and c.tables["same"].blocks == c.tables["a"].blocks[:2]
    computed(c, "plain", tokens)
    c.salt("salted", "tenant-3")
    assert c.match_prefix("salted", tokens, 8) == 0 and c.match_prefix("plain-2", tokens, 8) == 8
