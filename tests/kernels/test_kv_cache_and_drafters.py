"""Paged KV cache bookkeeping and the drafters' exact behaviour."""

import numpy as np
import pytest
import torch

from specray.kernels.config import ModelConfig
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.draft_model import DraftModelDrafter
from specray.kernels.drafters.ngram import NgramDrafter, lookup, lookup_match, lookup_reference
from specray.kernels.kv_cache import OutOfBlocksError, PagedKVCache
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.sampling import SamplingConfig

CFG = ModelConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4,
                  max_position_embeddings=64, tie_word_embeddings=True)


def test_blocks_free_list_and_rollback():
    cache = PagedKVCache(CFG, num_blocks=4, block_size=3)
    cache.reserve("a", 7)  # 3 blocks
    assert cache.num_free_blocks == 1 and cache.slots("a", 5, 7).tolist() == [5, 6]
    cache.set_cached("a", 7)
    cache.set_cached("a", 4)  # rollback: a length update, blocks stay reserved
    assert cache.num_cached("a") == 4 and cache.num_free_blocks == 1
    with pytest.raises(OutOfBlocksError):
        cache.reserve("b", 4)
    cache.free("a")
    assert cache.num_free_blocks == 4 and cache.num_cached("a") == 0
    cache.reserve("b", 4)
    assert cache.slots("b", 0, 4).tolist() == [0, 1, 2, 3]


def test_release_unused_returns_blocks_past_the_cached_tokens():
    """After a tree round: blocks past the kept tokens go back; slots then follow the new blocks."""
    cache = PagedKVCache(CFG, num_blocks=6, block_size=3)
    cache.reserve("b", 3)  # another sequence holds block 0
    cache.reserve("a", 9)  # blocks 1, 2, 3
    assert cache.slots("a", 0, 9).tolist() == list(range(3, 12))
    cache.set_cached("a", 4)  # 4 tokens kept: 2 blocks
    assert cache.release_unused("a") == 1 and cache.num_free_blocks == 3
    assert cache.release_unused("a") == 0 and cache.slots("a", 0, 4).tolist() == [3, 4, 5, 6]
    cache.reserve("b", 6)  # "b" takes the released block 3
    cache.reserve("a", 7)  # "a" gets another block at the same index: its slots must follow
    assert cache.tables["a"].blocks == [1, 2, 4] and cache.slots("a", 6, 7).tolist() == [12]


def test_slots_follow_new_blocks_and_reuse():
    """`slots` keeps each sequence's block slots between steps: a new block, or the same id reused
    after `free` with other blocks, must show up."""
    cache = PagedKVCache(CFG, num_blocks=6, block_size=2)
    cache.reserve("x", 2)  # block 0
    cache.reserve("a", 3)  # blocks 1, 2
    assert cache.slots("a", 0, 3).tolist() == [2, 3, 4]
    cache.reserve("a", 5)  # gains block 3
    assert cache.slots("a", 0, 5).tolist() == [2, 3, 4, 5, 6] and cache.slots("a", 4, 6).tolist() == [6, 7]
    cache.free("a")
    cache.free("x")
    cache.reserve("b", 4)  # blocks 0, 1
    cache.reserve("a", 5)  # the same id and block count as before, other blocks: 2, 3, 4
    assert cache.tables["a"].blocks == [2, 3, 4]
    assert cache.slots("a", 0, 6).tolist() == [4, 5, 6, 7, 8, 9]
    with pytest.raises(AssertionError):
        cache.slots("a", 0, 7)  # past its blocks


@pytest.mark.parametrize("find", [lookup, lookup_reference])
def test_ngram_lookup_exact(find):
    toks = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    assert find(toks, 3, 1, 3) == [8, 9, 5]  # trailing [5 6 7] matched at 0
    assert find(toks, 9, 1, 3) == [8, 9, 5, 6, 7]  # continuation stops at the end
    assert find(np.array([1, 2, 3, 4]), 3, 1, 2) == []  # no earlier occurrence
    assert find(np.array([4, 1, 2, 9, 2]), 2, 1, 2) == [9, 2]  # falls back to n=1, earliest match
    assert find(np.array([3, 1, 2, 7, 1, 2, 8, 1, 2]), 1, 2, 4) == [7]  # the earliest of equal matches
    assert find(np.array([1, 2, 5, 9, 1, 2, 6, 0, 1, 2, 5]), 2, 1, 4) == [9, 1]  # the longest first
    assert find(np.array([2, 2]), 3, 1, 4) == [2] and find(np.array([7]), 3, 1, 4) == []


def test_ngram_lookup_matches_its_reference_on_random_sequences():
    rng = np.random.default_rng(0)
    for _ in range(3000):  # few distinct tokens: many partial and overlapping matches
        toks = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 40)))
        lo = int(rng.integers(1, 5))
        hi, k = int(rng.integers(lo, 9)), int(rng.integers(1, 6))
        assert lookup(toks, k, lo, hi) == lookup_reference(toks, k, lo, hi), (toks.tolist(), k, lo, hi)
        draft, n = lookup_match(toks, k, lo, hi)
        assert n == _reference_match_length(toks, lo, hi) and (n > 0) == bool(draft), (toks.tolist(), lo, hi)


def _reference_match_length(toks: np.ndarray, lo: int, hi: int) -> int:
    """The longest n in [lo, hi] whose trailing n tokens occur earlier, by brute force; 0 if none."""
    for n in range(min(hi, len(toks) - 1), lo - 1, -1):
        tail = toks[len(toks) - n:].tolist()
        if any(toks[i:i + n].tolist() == tail for i in range(len(toks) - n)):
            return n
    return 0


def test_ngram_lookup_match_says_how_long_its_match_is():
    assert lookup_match(np.array([5, 6, 7, 8, 9, 5, 6, 7]), 3, 1, 3) == ([8, 9, 5], 3)
    assert lookup_match(np.array([4, 1, 2, 9, 2]), 2, 1, 2) == ([9, 2], 1)  # only the last token matched
    assert lookup_match(np.array([4, 1, 2, 9, 2]), 2, 2, 2) == ([], 0)  # below the minimum
    assert lookup_match(np.array([1, 2, 3, 4]), 3, 1, 2) == ([], 0)


def test_ngram_drafter_refuses_bad_bounds_and_proposes_point_masses():
    with pytest.raises(ValueError):
        NgramDrafter(3, 2)
    prop = NgramDrafter(1, 3).propose([DraftRequest("s", [5, 6, 7, 8, 5, 6], 2, SamplingConfig(0.0))])[0]
    assert prop.draft_token_ids == [7, 8] and prop.draft_probs is None


def test_draft_model_calibration_drops_rejected_kv(tiny_target):
    """After a partial acceptance the drafter keeps exactly the accepted prefix's KV and its next
    proposal equals a fresh drafter's proposal for the same committed tokens."""
    model = load_model(Checkpoint(tiny_target, "t"))
    greedy = SamplingConfig(0.0)
    drafter = DraftModelDrafter(model, num_blocks=32, block_size=4)
    history = [1, 9, 17, 33, 4]
    first = drafter.propose([DraftRequest("s", history, 4, greedy)])[0].draft_token_ids
    assert drafter.cache.num_cached("s") == len(history) + 3  # d1..d3 fed, d4 not
    committed = history + first[:2] + [(first[2] + 1) % 97]  # two accepted, then a recovered token
    again = drafter.propose([DraftRequest("s", committed, 3, greedy)])[0].draft_token_ids
    assert drafter.states["s"].fed[: len(committed)] == committed
    fresh = DraftModelDrafter(model, num_blocks=32, block_size=4)
    assert again == fresh.propose([DraftRequest("s", committed, 3, greedy)])[0].draft_token_ids
    drafter.release("s")
    assert drafter.cache.num_free_blocks == 32


def test_draft_model_sampled_proposals_carry_their_distribution(tiny_target):
    model = load_model(Checkpoint(tiny_target, "t"))
    drafter = DraftModelDrafter(model, num_blocks=16, block_size=4)
    req = DraftRequest("s", [1, 5, 9], 3, SamplingConfig(1.0, top_k=5), torch.Generator().manual_seed(0))
    prop = drafter.propose([req])[0]
    assert prop.draft_probs.shape == (3, 97)
    for tok, p in zip(prop.draft_token_ids, prop.draft_probs):
        assert p[tok] > 0 and int((p > 0).sum()) <= 5 and abs(float(p.sum()) - 1) < 1e-5
