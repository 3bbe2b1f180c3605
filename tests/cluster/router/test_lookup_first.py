"""Prompt lookup first, a draft model otherwise (speculative_config['lookup_first']): which drafter
proposes, the feature draft keeping its features through lookup rounds, greedy token-for-token
equality, seeded determinism, statistical losslessness with a negative control, and bad input."""

import numpy as np
import pytest
import torch

from specray import LLM, SamplingParams
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.hybrid import LookupFirstDrafter, LookupOptions
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig
from specray.kernels.verify import chain as verify

from router_helpers import GREEDY, chi2, exact_second_token_distribution, prompts

GREEDY_CFG = SamplingConfig(temperature=0.0)


class RecordingDrafter:
    """A model drafter's protocol; proposes [99] * k and records what it was asked."""

    name = "recording"

    def __init__(self):
        self.asked: list[list[object]] = []
        self.deferred: list[object] = []

    def propose(self, requests):
        self.asked.append([r.seq_id for r in requests])
        return [Proposal([99] * r.num_draft_tokens) for r in requests]

    def defer(self, requests):
        self.deferred.extend(r.seq_id for r in requests)

    def release(self, seq_id):
        pass


def request(seq_id, tokens, k=3, budget=None):
    return DraftRequest(seq_id, tokens, k, GREEDY_CFG, verify_budget=budget)


def test_lookup_proposes_where_the_suffix_recurs_and_the_model_elsewhere():
    model = RecordingDrafter()
    drafter = LookupFirstDrafter(model, LookupOptions(min_match=2, max_match=4))
    repeat = [5, 6, 7, 8, 9, 5, 6]  # "5 6" occurred before: its continuation is 7 8 9
    fresh = [5, 6, 7, 8, 9, 4, 6]  # "4 6" did not; a 1-token match ("6") is below min_match
    out = drafter.propose([request("a", repeat), request("b", fresh), request("c", repeat, budget=2)])
    assert out[0].draft_token_ids == [7, 8, 9] and out[0].draft_probs is None
    assert out[1].draft_token_ids == [99, 99, 99]
    assert out[2].draft_token_ids == [7, 8], "the verify budget caps a lookup too"
    assert model.asked == [["b"]] and model.deferred == ["a", "c"]
    assert (drafter.lookup_rounds, drafter.model_rounds) == (2, 1)


def test_model_tokens_caps_the_model_not_the_lookup():
    model = RecordingDrafter()
    drafter = LookupFirstDrafter(model, LookupOptions(min_match=2, model_tokens=1))
    out = drafter.propose([request("a", [5, 6, 7, 8, 9, 5, 6], k=3), request("b", [4, 4, 5], k=3)])
    assert out[0].draft_token_ids == [7, 8, 9] and out[1].draft_token_ids == [99]


def test_no_draft_tokens_means_no_lookup_and_the_model_still_calibrates():
    model = RecordingDrafter()
    drafter = LookupFirstDrafter(model, LookupOptions(min_match=1))
    out = drafter.propose([request("a", [5, 6, 5, 6], k=0)])
    assert out[0].draft_token_ids == [] and model.asked == [["a"]]


def test_the_feature_draft_keeps_target_features_through_lookup_rounds(tiny_target, tmp_path):
    from specray.kernels.drafters.options import DraftOptions
    from specray.kernels.drafters.registry import build_drafter

    from eagle_helpers import save_tiny_eagle

    eagle = save_tiny_eagle(tmp_path / "eagle", tiny_target, seed=3, noise=0.2)
    drafter = build_drafter(DraftOptions("eagle", str(eagle), lookup_first={"min_match": 2}, draft_quantization="none"))
    assert isinstance(drafter, LookupFirstDrafter)
    h = drafter.model_drafter.model.config.hidden_size
    first = torch.randn(4, h)  # the prefill's 4 positions
    drafter.propose([DraftRequest("s", [1, 5, 6, 9, 5], 2, GREEDY_CFG, features=first)])
    assert drafter.model_rounds == 1
    second = torch.randn(1, h)
    tokens = [1, 5, 6, 9, 5, 6]  # "5 6" recurs: a lookup round, the features wait
    assert drafter.propose([DraftRequest("s", tokens, 2, GREEDY_CFG, features=second)])[0].draft_token_ids == [9, 5]
    assert torch.equal(drafter.model_drafter.states["s"].unfed[0], second)
    third = torch.randn(1, h)
    drafter.propose([DraftRequest("s", tokens + [4], 2, GREEDY_CFG, features=third)])
    assert drafter.model_drafter.states["s"].fed == len(tokens), "every committed position fed from true features"


TREE = {"kind": "rsd_c", "branching": [2, 2]}
TOPK = {"kind": "topk", "k": 3, "width": 4}  # EAGLE-2 style, under a verify budget (docs/speculation.md's tree row)


@pytest.mark.parametrize("method,tree,pipelined,budget", [
    ("draft_model", None, False, None), ("eagle", None, False, None), ("draft_model", TREE, False, None),
    ("eagle", TREE, True, None), ("eagle", TOPK, False, 8)])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_lookup_first_equals_non_speculative(tiny_target, tiny_draft, tmp_path_factory, method, tree,
                                                    pipelined, budget, batch):
    """Chains, and trees beside lookup chains in one verification batch; pipelined or not."""
    from eagle_helpers import save_tiny_eagle

    want = [o.outputs[0].token_ids for o in LLM(str(tiny_target), kv_cache_tokens=8192).generate(prompts(batch), GREEDY)]
    draft = (str(tiny_draft) if method == "draft_model"
             else str(save_tiny_eagle(tmp_path_factory.mktemp("eagle"), tiny_target, seed=3, noise=0.2)))
    llm = LLM(str(tiny_target), kv_cache_tokens=8192, pipelined=pipelined, speculative_config={
        "method": method, "model": draft, "num_speculative_tokens": 4, "tree": tree, "verify_budget": budget,
        "lookup_first": {"min_match": 1, "model_tokens": 2}})
    outs = llm.generate(prompts(batch), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == want
    drafter = llm.draft.drafter
    assert drafter.lookup_rounds > 0 and drafter.model_rounds > 0, "both drafters must have proposed"
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


# -- sampled: the chain rule with one-hot (lookup) or model proposals -----------------------------
PROMPT = {"prompt_token_ids": [1, *range(3, 60, 2)]}  # half the vocabulary: the first token often recurs
N = 12_000


@pytest.fixture(scope="module")
def lookup_llm(peaky_models):
    target, draft = peaky_models
    return LLM(str(target), kv_cache_tokens=65536, max_num_seqs=512, speculative_config={
        "model": str(draft), "num_speculative_tokens": 3, "lookup_first": {"min_match": 1, "max_match": 2}})


def second_tokens(llm, n):
    drafter = llm.draft.drafter
    drafter.lookup_rounds = drafter.model_rounds = 0
    outs = llm.generate([PROMPT] * n, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    assert drafter.lookup_rounds > n // 10 and drafter.model_rounds > n // 10, "both drafters must propose"
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0 < accepted < sum(o.metrics.num_draft_tokens for o in outs)
    return np.array([o.outputs[0].token_ids[1] for o in outs])


def test_lookup_first_sampling_is_lossless(lookup_llm):
    torch.manual_seed(0)
    want = exact_second_token_distribution(lookup_llm, PROMPT["prompt_token_ids"])
    assert chi2(second_tokens(lookup_llm, N), want) > 1e-3


def test_lookup_first_negative_control_detected(lookup_llm, monkeypatch):
    torch.manual_seed(1)
    want = exact_second_token_distribution(lookup_llm, PROMPT["prompt_token_ids"])
    monkeypatch.setattr(verify, "residual_distribution", lambda q, p: q)
    # a third of the lossless test's samples leaves the control's p-value many orders below the bar
    assert chi2(second_tokens(lookup_llm, N // 3), want) < 1e-6


def test_lookup_first_seeded_requests_reproduce(lookup_llm):
    sp = SamplingParams(temperature=0.9, max_tokens=20, seed=5, ignore_eos=True)
    alone = lookup_llm.generate(PROMPT, sp)[0].outputs[0].token_ids
    batch = lookup_llm.generate([{"prompt_token_ids": [1, 7, 9]}, PROMPT],
                                [SamplingParams(temperature=1.0, max_tokens=12), sp])
    assert batch[1].outputs[0].token_ids == alone


def test_sampled_trees_beside_lookup_chains_reproduce(peaky_models):
    """At T = 1 the router verifies lookup chains by the chain rule and RSD trees by recursive
    rejection sampling in one batch; seeded outputs repeat (each rule's statistics are tested
    on its own)."""
    target, draft = peaky_models
    llm = LLM(str(target), speculative_config={"model": str(draft), "num_speculative_tokens": 3, "tree": TREE,
                                               "lookup_first": {"min_match": 1}})
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=s, ignore_eos=True) for s in range(6)]
    first = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * 6, params)]
    again = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * 6, params)]
    assert first == again and len(set(map(tuple, first))) > 1
    assert llm.draft.drafter.lookup_rounds > 0 and llm.draft.drafter.model_rounds > 0


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,match", [
    ({"method": "ngram", "lookup_first": True}, "needs method 'draft_model' or 'eagle'"),
    ({"model": "x", "lookup_first": {"min_match": 3, "max_match": 2}}, "1 <= min_match <= max_match"),
    ({"model": "x", "lookup_first": {"n": 2}}, "unknown lookup_first keys"),
    ({"model": "x", "lookup_first": {"model_tokens": 0}}, "model_tokens must be an integer >= 1"),
    ({"model": "x", "lookup_first": "yes"}, "must be true or a dict"),
    ({"model": "x", "lookup_first": True, "verify": "rrs"}, r"proposes \['chain'\]"),
])
def test_bad_lookup_first_configs_are_refused(cfg, match):
    from specray.cluster.config.speculative import SpeculativeConfig

    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict(cfg)


def test_cli_flags_reach_the_speculative_config(tmp_path):
    from specray.cluster.cli import build_parser, main, speculative_config
    from specray.cluster.serve.cli import resolve_config
    from specray.cluster.serve.drafter_cli import drafter_spec

    args = build_parser().parse_args(["generate", "--speculative-method", "eagle", "--draft-model", "d",
                                      "--lookup-first"])
    assert speculative_config(args)["lookup_first"] is True
    serve = build_parser().parse_args(["serve", "--speculative-method", "draft_model",
                                       "--draft-model", "smollm2-135m-draft", "--lookup-first"])
    assert resolve_config(serve).speculative_config["lookup_first"] is True
    drafter = build_parser().parse_args(["drafter", "--method", "draft_model", "--model", "d", "--lookup-first"])
    assert drafter_spec(drafter).lookup_first is True
    bad = build_parser().parse_args(["drafter", "--method", "ngram", "--lookup-first"])
    with pytest.raises(ValueError, match="lookup_first"):
        drafter_spec(bad)
    assert main(["generate", "--speculative-method", "ngram", "--lookup-first", "--model", "nowhere"]) == 2


def test_a_draft_worker_builds_from_its_spec(tiny_draft):
    """What the Ray, torch_distributed and gRPC draft pools construct on their side."""
    from specray.actors.draft_worker import DraftWorker
    from specray.actors.specs import DraftSpec

    worker = DraftWorker.from_spec(DraftSpec("draft_model", str(tiny_draft), lookup_first={"model_tokens": 1}))
    assert isinstance(worker.drafter, LookupFirstDrafter) and worker.drafter.options.model_tokens == 1
    assert worker.drafter.name == "draft_model+lookup"
