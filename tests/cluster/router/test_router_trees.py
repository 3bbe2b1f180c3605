"""Tree and multi-draft speculation end to end on tiny fp32 models: greedy output with every tree
method equals non-speculative greedy output token for token (DESIGN §8 tier 4), budgets hold,
and configuration errors are clear."""

import pytest

from specray import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
TREES = {
    "rsd_c": {"kind": "rsd_c", "branching": [3, 2, 1]},
    "rsd_s": {"kind": "rsd_s", "width": 3},
    "spectr": {"kind": "spectr", "k": 3},
    "topk": {"kind": "topk", "k": 3, "width": 3},
}


def prompts(n):
    return [{"prompt_token_ids": [1] + [3 + (i * 7 + j * 13) % 90 for j in range(3 + i % 4)] * 2} for i in range(n)]


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = LLM(str(tiny_target), kv_cache_tokens=8192)
    return [o.outputs[0].token_ids for o in llm.generate(prompts(5), GREEDY)]


@pytest.mark.parametrize("tree", sorted(TREES))
def test_greedy_trees_equal_non_speculative(tiny_target, tiny_draft, reference, tree):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3,
                                                    "tree": TREES[tree]}, kv_cache_tokens=8192)
    outs = llm.generate(prompts(5), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert accepted > 0


def test_greedy_aded_equals_non_speculative(tiny_target, reference):
    llm = LLM(str(tiny_target), speculative_config={"method": "aded", "num_speculative_tokens": 3,
                                                    "aded": {"max_nodes": 8}}, kv_cache_tokens=8192)
    outs = llm.generate(prompts(5), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0  # the prompts repeat: online tri-grams hit


@pytest.mark.parametrize("tree", sorted(TREES) + ["aded"])
def test_verify_budget_caps_every_round(tiny_target, tiny_draft, reference, tree):
    cfg = ({"method": "aded"} if tree == "aded" else {"model": str(tiny_draft), "tree": TREES[tree]})
    llm = LLM(str(tiny_target), speculative_config={**cfg, "num_speculative_tokens": 3, "verify_budget": 4},
              kv_cache_tokens=8192)
    outs = llm.generate(prompts(5), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    for o in outs:
        assert o.metrics.num_draft_tokens <= 4 * o.metrics.num_rounds


@pytest.mark.parametrize("bad, match", [
    ({"tree": {"kind": "beam"}}, "unknown tree kind"),
    ({"tree": {"kind": "rsd_c", "branching": [2], "width": 3}}, "unknown keys"),
    ({"tree": {"kind": "rsd_c"}}, "branching"),
    ({"tree": {"kind": "spectr", "k": 0}}, "k must be"),
    ({"verify_budget": 0}, "verify_budget"),
    ({"method": "ngram", "tree": {"kind": "topk"}}, "needs method 'draft_model'"),
    ({"method": "aded", "aded": {"simulation": 3}}, "unknown aded keys"),
])
def test_tree_config_errors_are_clear(tiny_target, tiny_draft, bad, match):
    cfg = {"model": str(tiny_draft), **bad}
    if cfg.get("method") in ("ngram", "aded"):
        cfg.pop("model")
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_target), speculative_config=cfg)


def test_pipelined_trees_give_the_same_tokens(tiny_target, tiny_draft, reference):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3,
                                                    "tree": TREES["rsd_s"]}, kv_cache_tokens=8192, pipelined=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts(5), GREEDY)] == reference


@pytest.mark.parametrize("tree", ["rsd_c", "spectr"])
def test_seeded_tree_sampling_reproduces_alone_or_in_a_batch(tiny_target, tiny_draft, tree):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3,
                                                    "tree": TREES[tree]}, kv_cache_tokens=8192)
    sp = SamplingParams(temperature=1.0, max_tokens=16, seed=42, ignore_eos=True)
    alone = llm.generate(prompts(1), sp)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    batch = llm.generate(prompts(4), [sp, others, others, others])
    assert batch[0].outputs[0].token_ids == alone


def test_per_request_verify_budget(tiny_target, tiny_draft, reference):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3,
                                                    "tree": TREES["topk"]}, kv_cache_tokens=8192)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, verify_budget=b) for b in (2, None, 5)]
    outs = llm.generate(prompts(3), params)
    assert [o.outputs[0].token_ids for o in outs] == reference[:3]
    assert outs[0].metrics.num_draft_tokens <= 2 * outs[0].metrics.num_rounds
    assert outs[1].metrics.num_draft_tokens > 5 * outs[1].metrics.num_rounds  # unbudgeted trees are larger
    with pytest.raises(ValueError, match="verify_budget"):
        SamplingParams(verify_budget=0)


@pytest.mark.parametrize("cfg, ok", [
    ({"model": "d", "verify": "kseq"}, False), ({"model": "d", "verify": "chain"}, True),
    ({"model": "d", "tree": {"kind": "rsd_c", "branching": [2, 1]}, "verify": "descent"}, False),
    ({"model": "d", "tree": {"kind": "rsd_s", "width": 2}, "verify": "rrs"}, True),
    ({"model": "d", "tree": {"kind": "spectr", "k": 2}, "verify": "rrs"}, False),
    ({"model": "d", "tree": {"kind": "spectr", "k": 2}, "verify": "kseq"}, True),
    ({"model": "d", "tree": {"kind": "topk"}, "verify": "descent"}, True),
    ({"method": "aded", "verify": "rrs"}, False), ({"method": "aded", "verify": "descent"}, True),
    ({"method": "ngram", "verify": "chain"}, True), ({"method": "ngram", "verify": "kseq"}, False),
    # lookup rounds propose chains, the model's rounds trees: no one rule verifies both
    ({"model": "d", "tree": {"kind": "spectr", "k": 2}, "lookup_first": True, "verify": "kseq"}, False),
    ({"model": "d", "tree": {"kind": "spectr", "k": 2}, "lookup_first": True, "verify": "auto"}, True),
])
def test_a_fixed_rule_must_verify_every_kind_the_drafts_take(cfg, ok):
    from specray.cluster.config.speculative import SpeculativeConfig

    if ok:
        SpeculativeConfig.from_dict(cfg)
    else:
        with pytest.raises(ValueError, match=f"verify {cfg['verify']!r} is exact only for"):
            SpeculativeConfig.from_dict(cfg)


def test_configured_rule_mismatch_is_refused_at_start(tiny_target, tiny_draft):
    """A rule that cannot verify the drafts' kind is refused with the config, not at every sampled
    request's first round."""
    cfg = {"model": str(tiny_draft), "num_speculative_tokens": 2, "tree": TREES["topk"], "verify": "chain"}
    with pytest.raises(ValueError, match="verify 'chain' is exact only for 'chain' proposals.*deterministic_tree"):
        LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=4096)
    ok = LLM(str(tiny_target), speculative_config={**cfg, "verify": "descent"}, kv_cache_tokens=4096)
    assert len(ok.generate(prompts(1), SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True))[0]
               .outputs[0].token_ids) == 8
    with pytest.raises(ValueError, match="unknown verify rule"):
        LLM(str(tiny_target), speculative_config={**cfg, "verify": "longest"})


@pytest.mark.parametrize("tree", ["topk", "rsd_c"])
def test_a_tree_grown_whole_fits_the_draft_cache_at_the_end_of_a_full_one(tiny_target, tiny_draft, tree):
    """Top-k and RSD-C trees grow whole, then are cut to the budget: near the end of a cache the
    target's reservation holds, the draft's scratch outgrew the same blocks and every round fell
    back to target-only, logging a traceback."""
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 4, "tree": {**TREES[tree], "k": 4, "width": 4}
            if tree == "topk" else {"kind": "rsd_c", "branching": [4, 3, 2, 1]}, "verify_budget": 8}
    fill_the_cache_like_plain(tiny_target, spec)


@pytest.mark.parametrize("tree", ["rsd_s", "spectr"])
def test_a_greedy_beam_tree_fits_what_the_router_reserved(tiny_target, tiny_draft, tree):
    """A greedy request's RSD-S or SpecTr tree is a beam of `width` nodes a level, the width x depth
    nodes `TreeSpec.max_nodes` reserves: it grew width children under every beam node (4 + 3 x 16
    nodes for 4 x 4), so at the end of a full cache the target step ran out of blocks and the
    request failed."""
    shape = {"kind": "rsd_s", "width": 4} if tree == "rsd_s" else {"kind": "spectr", "k": 4}
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 4, "tree": shape}
    out = fill_the_cache_like_plain(tiny_target, spec)
    assert out.metrics.num_draft_tokens <= 16 * out.metrics.num_rounds


def fill_the_cache_like_plain(tiny_target, spec: dict):
    """One greedy request that fills a 64-token cache: the same tokens as plain decoding, every round
    drafted (no fallback to target-only); -> its output."""
    llm = LLM(str(tiny_target), speculative_config=spec, kv_cache_tokens=64, max_model_len=63)
    plain = LLM(str(tiny_target), kv_cache_tokens=64, max_model_len=63)
    prompt = prompts(1)[0]["prompt_token_ids"] * 4  # 32 tokens: the sequence fills the cache
    params = SamplingParams(temperature=0.0, max_tokens=31, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": prompt}, params)[0]
    assert out.outputs[0].token_ids == plain.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
    assert llm.router.stats.draft_fallbacks == 0 and out.metrics.num_draft_tokens > 0
    return out
