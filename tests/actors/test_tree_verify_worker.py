"""TargetWorker with tree proposals: one ragged pass with a chain and trees, greedy verification,
and the accepted path's KV compacted into place (equal to a fresh prefill of the same tokens)."""

import pytest
import torch

from specray.actors.messages import SeqSpec, TargetItem
from specray.actors.target_worker import TargetWorker
from specray.kernels.ints import ceil_div
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig

GREEDY = SeqSpec(SamplingConfig(0.0))


@pytest.fixture(scope="module")
def model(tiny_target):
    return load_model(Checkpoint(tiny_target, "t"))


def greedy_tokens(model, prompt, n):
    w = TargetWorker(model, num_blocks=32, block_size=4)
    out = w.step([TargetItem("s", prompt, Proposal([]), GREEDY)])[0].emitted_token_ids
    while len(out) < n:
        out += w.step([TargetItem("s", out[-1:], Proposal([]))])[0].emitted_token_ids
    return out[:n]


def decoy_tree(path, vocab=97):
    """A tree where the path's tokens sit on the last sibling at every depth (so compaction moves
    them), next to decoy siblings and a decoy subtree."""
    tokens, parents, parent = [], [], -1
    for tok in path:
        decoy = (tok + 1) % vocab
        tokens += [decoy, (decoy + 7) % vocab, tok]
        parents += [parent, len(tokens) - 3, parent]  # decoy's own child, then the real token
        parent = len(tokens) - 1
    return Proposal(tokens, parents=parents, kind="deterministic_tree")


def test_tree_verification_compacts_the_accepted_path(model):
    prompts = {"a": [5, 9, 11, 40], "b": [7, 3, 3, 8, 21, 60]}
    want = {s: greedy_tokens(model, p, 8) for s, p in prompts.items()}
    w = TargetWorker(model, num_blocks=64, block_size=4)
    first = w.step([TargetItem(s, p, Proposal([]), GREEDY) for s, p in prompts.items()])
    assert [r.next_token_id for r in first] == [want["a"][0], want["b"][0]]
    # round 1: "a" brings a tree holding its next 3 greedy tokens, "b" a chain with a wrong token
    tree = decoy_tree(want["a"][1:4])
    chain = Proposal([want["b"][1], (want["b"][2] + 1) % 97])
    res = w.step([TargetItem("a", want["a"][:1], tree), TargetItem("b", want["b"][:1], chain)])
    assert res[0].accepted_token_ids == want["a"][1:4] and res[0].accepted_nodes == [2, 5, 8]
    assert res[0].is_bonus and res[0].next_token_id == want["a"][4]
    assert res[1].emitted_token_ids == want["b"][1:3]
    # the compacted cache equals a fresh prefill of the committed tokens
    committed = prompts["a"] + want["a"][:4]
    fresh = TargetWorker(model, num_blocks=16, block_size=4)
    fresh.step([TargetItem("a", committed, Proposal([]), GREEDY)])
    n = len(committed)
    got_kv = w.cache.kv[:, :, w.cache.slots("a", 0, n)]
    want_kv = fresh.cache.kv[:, :, fresh.cache.slots("a", 0, n)]
    assert w.cache.num_cached("a") == n
    torch.testing.assert_close(got_kv, want_kv, atol=1e-5, rtol=1e-5)
    # the rejected branches' blocks are free again: "a" holds just the blocks its tokens fill
    assert len(w.cache.tables["a"].blocks) == ceil_div(n, 4)
    assert w.cache.num_free_blocks == 64 - len(w.cache.tables["a"].blocks) - len(w.cache.tables["b"].blocks)
    # and decoding continues exactly
    res = w.step([TargetItem("a", want["a"][4:5], decoy_tree(want["a"][5:7])),
                  TargetItem("b", want["b"][2:3], Proposal([]))])
    assert res[0].emitted_token_ids == want["a"][5:8] and res[1].emitted_token_ids == want["b"][3:4]


def test_rule_mismatch_raises_before_any_kv_is_written(model):
    w = TargetWorker(model, num_blocks=16, block_size=4)
    sampled = SeqSpec(SamplingConfig(1.0), seed=0)
    w.step([TargetItem("s", [5, 9, 11], Proposal([]), sampled)])
    tree = Proposal([1, 2], parents=[-1, -1], kind="deterministic_tree")
    with pytest.raises(ValueError, match="cannot verify"):
        w.step([TargetItem("s", [4], tree, rule="chain")])
    with pytest.raises(ValueError, match="unknown verification rule"):
        w.step([TargetItem("s", [4], tree, rule="longest")])
    assert w.cache.num_cached("s") == 3
    res = w.step([TargetItem("s", [4], tree)])[0]  # the worker picks descent from the kind
    assert 1 <= len(res.emitted_token_ids) <= 2
