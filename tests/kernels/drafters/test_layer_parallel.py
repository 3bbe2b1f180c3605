"""EasySpec's layer-parallel (fuzzy) drafting: the grouping, the fuzzy forward against a naive
reading of the method, bonus calibration (the committed draft KV equals a sequential run's after
every round, and would not without it), greedy equivalence through chains, trees, VocabTrim and
lookup_first at batch sizes 1-16, the target's law at temperature 1 (with a negative control), and
clear errors for every bad value."""

import pytest
import torch
import torch.nn.functional as F

from specray import LLM, SamplingParams
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.layer_parallel import FuzzyForward, LayerGroups
from specray.kernels.loader import load_model, resolve
from specray.kernels.verify import chain as verify

from helpers import save_tiny_llama
from router_helpers import chi2, exact_second_token_distribution, second_tokens

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A 6-layer target and its perturbed draft (4 middle layers: groups up to 4)."""
    target = save_tiny_llama(tmp_path_factory.mktemp("deep_target"), seed=0, num_hidden_layers=6, head_scale=3.0)
    draft = save_tiny_llama(tmp_path_factory.mktemp("deep_draft"), seed=1, perturb_from=target, noise=0.1)
    return target, draft


def spec(draft, n, k=3, **kw):
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k, "layer_parallel": n,
            "draft_quantization": "none", **kw}


@pytest.mark.parametrize("layers, size, want", [
    (6, 1, ((0,), (1,), (2,), (3,), (4,), (5,))),
    (6, 2, ((0,), (1, 2), (3, 4), (5,))),
    (6, 3, ((0,), (1, 2, 3), (4,), (5,))),
    (6, 4, ((0,), (1, 2, 3, 4), (5,))),
    (30, 4, ((0,), *(tuple(range(s, min(s + 4, 29))) for s in range(1, 29, 4)), (29,))),
])
def test_groups_are_runs_of_the_middle_layers(layers, size, want):
    groups = LayerGroups.uniform(layers, size)
    assert groups.groups == want and groups.sequential_steps == len(want)


@pytest.mark.parametrize("size, words", [(0, ">= 1"), (5, "exceeds the draft's 4 middle layers"), (True, ">= 1")])
def test_bad_group_sizes_are_clear_errors(size, words):
    with pytest.raises(ValueError, match=words):
        LayerGroups.uniform(6, size)


def naive_fuzzy_logits(model, ids: list[int], groups: LayerGroups) -> torch.Tensor:
    """The method as written, for one prompt from an empty cache: h0 enters a group; every layer's
    attention reads norm_i(h0); h += attn_i; h += mlp_i(post_norm_i(h)), layer by layer."""
    c, eps = model.config, model.config.rms_norm_eps
    n = len(ids)
    rot = model.rotary.rotation(torch.arange(n))  # [n, head_dim, head_dim]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    h = model.embed_tokens[torch.tensor(ids)]
    for group in groups.groups:
        h0 = h
        for i in group:
            layer = model.layers[i]
            qkv = F.linear(F.rms_norm(h0, (c.hidden_size,), layer.input_norm, eps), layer.qkv_proj)
            qkv = qkv.view(n, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
            qk = torch.bmm(qkv[:, : c.num_heads + c.num_kv_heads], rot)
            q, k, v = qk[:, : c.num_heads], qk[:, c.num_heads:], qkv[:, c.num_heads + c.num_kv_heads:]
            rep = c.num_heads // c.num_kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [n, heads, dim]
            scores = torch.einsum("qhd,khd->hqk", q, k) * model.scale
            attn = torch.einsum("hqk,khd->qhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), v)
            h = h + F.linear(attn.reshape(n, -1), layer.o_proj)
            x = F.rms_norm(h, (c.hidden_size,), layer.post_attention_norm, eps)
            gate, up = F.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.down_proj)
    return F.linear(F.rms_norm(h, (c.hidden_size,), model.norm, eps), model.lm_head)  # [n, vocab]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_fuzzy_forward_is_the_method_as_written(deep, size):
    model = load_model(resolve(str(deep[1])))
    ids = [5, 17, 33, 2, 80, 41, 9, 12]
    groups = LayerGroups.uniform(len(model.layers), size)
    cache = model.make_cache(16)
    got = FuzzyForward(model, groups)(RaggedBatch.build([SeqChunk("s", ids, 0, num_logits=len(ids))], cache), cache)
    with torch.inference_mode():
        want = naive_fuzzy_logits(model, ids, groups)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        if size == 1:  # groups of one are the ordinary forward
            plain = model(RaggedBatch.build([SeqChunk("t", ids, 0, num_logits=len(ids))], cache), cache,
                          reference=True)
            assert torch.allclose(got, plain, atol=1e-4, rtol=1e-4)
        else:  # and larger groups really are another function
            assert not torch.allclose(got, naive_fuzzy_logits(model, ids, LayerGroups.uniform(6, 1)), atol=1e-2)


def prompts(n):
    return [{"prompt_token_ids": [1, 5 + i % 40, 17, 3 + (7 * i) % 80, 9] * (1 + i % 3)} for i in range(n)]


@pytest.mark.parametrize("extra", [
    {}, {"tree": {"kind": "topk", "k": 2, "width": 3}}, {"tree": {"kind": "rsd_c", "branching": [2, 2, 1]}},
    {"lookup_first": True}, {"draft_quantization": None},
])
@pytest.mark.parametrize("size", [2, 4])
def test_greedy_equals_plain_decoding(deep, extra, size):
    target, draft = deep
    want = [o.outputs[0].token_ids for o in LLM(str(target)).generate(prompts(16), GREEDY)]
    llm = LLM(str(target), speculative_config={**spec(draft, size), **extra})
    for n in (1, 5, 16):
        outs = llm.generate(prompts(16)[:n], GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == want[:n]
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


def test_greedy_with_vocab_trim(deep, tmp_path):
    from safetensors.torch import save_file

    from specray.kernels.drafters.vocab_trim import VOCAB_TRIM_FILE

    target, draft = deep
    folder = tmp_path / "trimmed"
    folder.mkdir()
    for f in draft.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    save_file({"token_ids": torch.arange(96, 36, -1, dtype=torch.int32)}, str(folder / VOCAB_TRIM_FILE))
    want = [o.outputs[0].token_ids for o in LLM(str(target)).generate(prompts(6), GREEDY)]
    llm = LLM(str(target), speculative_config=spec(folder, 3, draft_vocab_trim=60))
    assert llm.draft.drafter.name == "draft_model_vocab_trim" and llm.draft.drafter.fuzzy is not None
    assert [o.outputs[0].token_ids for o in llm.generate(prompts(6), GREEDY)] == want


def committed_kv(drafter, seq_id, n: int) -> torch.Tensor:
    """The draft cache's K/V of a sequence's first n positions [layers, 2 * kv_heads, n, head_dim]."""
    slots = drafter.cache.slots(seq_id, 0, n)
    return drafter.cache.kv[:, :, slots]


@pytest.mark.parametrize("calibrate", [True, False])
def test_calibration_rewrites_the_fuzzy_kv(deep, calibrate):
    """After every round, the KV of the committed positions equals that of one sequential draft
    pass over the same tokens; without calibration the fuzzy steps' KV stays, and it does not."""
    target, draft = deep
    llm = LLM(str(target), speculative_config=spec(draft, 4, k=4))
    drafter = llm.draft.drafter
    drafter.calibrate_fuzzy_kv = calibrate
    plain = LLM(str(target), speculative_config=spec(draft, 1, k=4)).draft.drafter  # sequential
    router = llm.router
    router.add_request(prompts(1)[0]["prompt_token_ids"], SamplingParams(temperature=0, max_tokens=40,
                                                                         ignore_eos=True))
    worst = 0.0
    while router.has_unfinished():
        router.step()
        for seq_id, state in drafter.states.items():
            exact = state.exact if calibrate else len(state.fed)
            if exact == 0:
                continue
            plain.release("ref")
            with torch.inference_mode():
                plain.model(RaggedBatch.build([SeqChunk("ref", state.fed[:exact], 0, num_logits=1)], plain.cache),
                            plain.cache)
            worst = max(worst, float((committed_kv(drafter, seq_id, exact) - committed_kv(plain, "ref", exact))
                                     .abs().max()))
    assert (worst < 1e-4) == calibrate


PEAKY_N = 12_000


@pytest.fixture(scope="module")
def peaky_llm(deep):
    target, draft = deep
    return LLM(str(target), speculative_config=spec(draft, 4, k=3), kv_cache_tokens=65536, max_num_seqs=512)


def test_sampling_keeps_the_targets_law(peaky_llm):
    torch.manual_seed(0)
    assert chi2(second_tokens(peaky_llm, PEAKY_N), exact_second_token_distribution(peaky_llm)) > 1e-3


def test_negative_control_is_detected(peaky_llm, monkeypatch):
    """A third of the lossless test's samples: p 3e-30 (1e-22 at a quarter)."""
    torch.manual_seed(1)
    want = exact_second_token_distribution(peaky_llm)
    monkeypatch.setattr(verify, "residual_distribution", lambda q, p: q)
    assert chi2(second_tokens(peaky_llm, PEAKY_N // 3), want) < 1e-6


@pytest.mark.parametrize("cfg, words", [
    ({"method": "ngram", "layer_parallel": 2}, "'layer_parallel' needs method 'draft_model'"),
    ({"method": "aded", "layer_parallel": 2}, "'layer_parallel' needs method 'draft_model'"),
    ({"method": "draft_model", "model": "x", "layer_parallel": 0}, "layer_parallel must be an integer >= 1"),
    ({"method": "draft_model", "model": "x", "layer_parallel": "2"}, "layer_parallel must be an integer >= 1"),
])
def test_bad_config_is_a_clear_error(cfg, words):
    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.config.speculative import SpeculativeConfig

    with pytest.raises(ValueError, match=words):
        SpeculativeConfig.from_dict(cfg)
    with pytest.raises(ValueError, match=words):
        ServeConfig.from_dict({"speculative_config": cfg})


def test_too_large_a_group_names_the_key(deep):
    with pytest.raises(ValueError, match="layer_parallel 5 exceeds the draft's 4 middle layers"):
        LLM(str(deep[0]), speculative_config=spec(deep[1], 5))


class GroupPool:
    """A draft pool of W ranks (threads of this process joined by a ThreadTPGroup), each a full
    DraftWorker receiving every call; records every rank's proposals of every round."""

    def __init__(self, draft, size: int, n: int, **options):
        from concurrent.futures import ThreadPoolExecutor

        from specray.actors.draft_worker import DraftWorker
        from specray.kernels.drafters.options import DraftOptions
        from specray.kernels.drafters.registry import build_drafter
        from specray.kernels.tensor_parallel import thread_groups

        opts = DraftOptions(method="draft_model", model=str(draft), layer_parallel=n, draft_quantization="none",
                            **options)
        groups = thread_groups(size) if size > 1 else [None]
        self.ranks = [DraftWorker(build_drafter(opts, g)) for g in groups]
        self.pool = ThreadPoolExecutor(len(self.ranks))
        self.rounds: list[list[list]] = []  # [round][rank] proposals

    def submit_propose(self, items):
        from specray.cluster.pools.api import Done

        per_rank = list(self.pool.map(lambda w: w.propose(items), self.ranks))
        self.rounds.append(per_rank)
        return Done(per_rank[0])

    def release(self, seq_id):
        for w in self.ranks:
            w.release(seq_id)


def same(a, b) -> bool:
    """Proposals equal bit for bit: tokens, tree shape and the proposal distributions."""
    if a.draft_token_ids != b.draft_token_ids or a.tree_parents() != b.tree_parents():
        return False
    pa, pb = a.draft_probs, b.draft_probs
    return (pa is None and pb is None) or (pa is not None and pb is not None and torch.equal(pa, pb))


@pytest.mark.parametrize("extra", [{}, {"tree": {"kind": "rsd_c", "branching": [2, 1, 1]}}])
@pytest.mark.parametrize("workers, n", [(2, 2), (4, 4), (3, 4)])
def test_a_draft_group_proposes_what_one_process_does(deep, workers, n, extra):
    """W ranks, each running one layer's attention of every group, propose bit for bit what one
    process proposes, greedy and sampled (seeded), round after round."""
    from specray.cluster.router.router import Router

    target, draft = deep
    runs = {}
    for size in (1, workers):
        llm = LLM(str(target), speculative_config={**spec(draft, n, k=3), **extra})
        pool = GroupPool(draft, size, n, tree=extra.get("tree"))
        llm.router = Router(llm.router.target, pool, llm.tokenizer, llm.router.eos_token_ids, llm.router.config)
        params = [GREEDY, SamplingParams(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)]
        outs = llm.generate(prompts(2), params)
        runs[size] = ([o.outputs[0].token_ids for o in outs], pool.rounds)
    (single_out, single_rounds), (group_out, group_rounds) = runs[1], runs[workers]
    assert group_out == single_out and len(group_rounds) == len(single_rounds)
    for one, every in zip(single_rounds, group_rounds, strict=True):
        for rank in every:  # every rank agrees with one process, proposal by proposal
            assert all(same(a, b) for a, b in zip(one[0], rank, strict=True))
    assert sum(len(p.draft_token_ids) for r in group_rounds for p in r[0]) > 0


def test_serve_refuses_groups_past_the_draft_before_ray_starts(deep, tiny_target):
    """The draft's worker refused it only once deployed: three attempts and ~400 lines of Ray's;
    a LongSpec window past the target's context the same."""
    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.serve.cli import check_model_and_context

    with pytest.raises(ValueError, match="layer_parallel 5 exceeds the draft's 4 middle layers"):
        check_model_and_context(ServeConfig.from_dict({"model": str(deep[0]), "speculative_config": spec(deep[1], 5)}))
    with pytest.raises(ValueError, match="layer_parallel 3 exceeds the draft's 2 middle layers"):
        check_model_and_context(ServeConfig.from_dict({"model": str(deep[0]),
                                                       "speculative_config": spec(deep[1], 3, draft_num_layers=4)}))
    check_model_and_context(ServeConfig.from_dict({"model": str(deep[0]), "speculative_config": spec(deep[1], 4)}))
    from specray.cluster.config.speculative import SpeculativeConfig
    from specray.kernels.drafters.loading import check_draft_shape
    from specray.kernels.loader import resolve

    long = SpeculativeConfig.from_dict({"method": "longspec", "model": "d", "longspec": {"window": 100000}})
    with pytest.raises(ValueError, match="the LongSpec window 100000 exceeds the target's context 512"):
        check_draft_shape(resolve(str(tiny_target)).path, long)
