"""ADED: tri-gram table (corpus + online), Monte-Carlo tree search drafts, options validation."""

import pytest

from specray.kernels.drafters.aded import AdedDrafter, AdedOptions, TrigramTable, load_corpus, next_tokens, search_tree
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.sampling import SamplingConfig


def test_table_counts_and_next_tokens_exact():
    t = TrigramTable()
    t.add([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert dict(t.tri[(1, 2)]) == {3: 2.0, 4: 1.0}
    assert next_tokens([(t, 1.0)], 1, 2, 2) == [(3, 2 / 3), (4, 1 / 3)]
    assert next_tokens([(t, 1.0)], 9, 2, 1) == [(3, 2 / 3)]  # unseen tri-gram: bi-gram fallback
    assert next_tokens([(t, 1.0)], 9, 8, 3) == []


def test_search_finds_the_likely_path_within_budget_and_depth():
    t = TrigramTable()
    t.add([1, 2, 3, 4, 5, 6] * 3 + [1, 2, 7])
    opts = AdedOptions(corpus=None, simulations=64, branching=2, max_nodes=6)
    tokens, parents = search_tree([(t, 1.0)], [1, 2], depth=4, budget=6, opts=opts)
    assert len(tokens) <= 6 and all(-1 <= p < i for i, p in enumerate(parents))
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    assert max(depth) <= 4
    deepest = depth.index(max(depth))  # the likely continuation 3 4 5 6 is the deepest path
    path = []
    while deepest >= 0:
        path.insert(0, tokens[deepest])
        deepest = parents[deepest]
    assert path == [3, 4, 5, 6]
    assert tokens[parents.index(-1)] == 3  # the most visited root child comes first


def test_online_update_drafts_the_sequence_s_own_repetition():
    drafter = AdedDrafter(AdedOptions(corpus=None, max_nodes=8))
    motif = [11, 12, 13, 14, 15]
    req = DraftRequest("s", motif * 3 + [11, 12], 3, SamplingConfig(0.0))
    proposal = drafter.propose([req])[0]
    assert proposal.kind == "deterministic_tree" and proposal.draft_probs is None
    root = [i for i, p in enumerate(proposal.parents) if p == -1]
    assert proposal.draft_token_ids[root[0]] == 13
    budgeted = drafter.propose([DraftRequest("s", req.token_ids, 3, SamplingConfig(0.0), verify_budget=2)])[0]
    assert budgeted.num_draft_tokens <= 2
    drafter.release("s")
    assert "s" not in drafter.local


def test_corpus_is_tokenised_with_the_target_tokenizer(tiny_target, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w5 w6 w7\nw5 w6 w7 w8\n")
    table = load_corpus(AdedOptions(corpus=str(corpus)), str(tiny_target))
    assert dict(table.tri[(5, 6)]) == {7: 2.0}
    builtin = load_corpus(AdedOptions(), str(tiny_target))  # English words are <unk> here, still loads
    assert builtin.bi


def test_options_are_validated():
    with pytest.raises(ValueError, match="unknown aded keys"):
        AdedOptions.from_dict({"simulation": 3})
    with pytest.raises(ValueError, match="branching"):
        AdedOptions(branching=0)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        load_corpus(AdedOptions(), None)
