"""The fast kernel modes (fast, fast16) end to end: each a model of its own (close to the exact
mode, not equal), whose rows ignore the other rows of a step, with speculation lossless against
plain decoding in that mode: greedy token for token at batch 1-16 and a chi-square on sampled
tokens (with a negative control), both against that mode's own distribution."""

import pytest
import torch

from specray import LLM, SamplingParams
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.fast_linear import FastWeight
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.quant_linear import PackedWeight, kernel_available
from specray.kernels.verify import chain as verify

from helpers import save_tiny_llama
from router_helpers import PROMPT, chi2, prompts, second_tokens

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no C compiler: no packed kernels, no fast mode")
FAST_MODES = ["fast", "fast16"]


@pytest.fixture(params=FAST_MODES)
def mode(request):
    return request.param


@pytest.fixture(scope="module")
def peaky_gguf(tmp_path_factory):
    """A peaky target whose weights are exact GGUF blocks, and its perturbed (fp32) draft."""
    target = save_tiny_llama(tmp_path_factory.mktemp("peaky_gguf"), seed=0, head_scale=3.0, gguf=True)
    draft = save_tiny_llama(tmp_path_factory.mktemp("peaky_gguf_draft"), seed=1, perturb_from=target, noise=0.35)
    return target, draft


def logits_of(model, chunks):
    cache = model.make_cache(256, block_size=4)
    for c in chunks:  # the context each chunk claims, as a prefill
        if c.context_len:
            model(RaggedBatch.build([SeqChunk(c.seq_id, list(range(3, 3 + c.context_len)), 0)], cache), cache)
            cache.set_cached(c.seq_id, c.context_len)
    return model(RaggedBatch.build(chunks, cache), cache)


def test_the_fast_mode_is_a_model_of_its_own(tiny_gguf_target, mode):
    exact = load_model(Checkpoint(tiny_gguf_target, "t"), kernels="exact")
    fast = load_model(Checkpoint(tiny_gguf_target, "t"), kernels=mode)
    assert all(isinstance(p, PackedWeight) for p in exact.packed_weights.values())
    assert all(isinstance(p, FastWeight) for p in fast.packed_weights.values())
    assert len(fast.packed_weights) == len(exact.packed_weights) == 1 + 4 * fast.config.num_layers
    chunk = [SeqChunk("a", [4, 5, 6, 7, 8], 0, num_logits=5)]
    a, b = logits_of(exact, chunk), logits_of(fast, chunk)
    assert not torch.equal(a, b)
    assert (a - b).norm() / a.norm() < (0.05 if mode == "fast" else 1e-3)
    with pytest.raises(ValueError, match="kernels must be"):
        load_model(Checkpoint(tiny_gguf_target, "t"), kernels="int4")


def test_a_rows_logits_ignore_the_other_rows_of_a_fast_step(tiny_gguf_target, mode):
    """Decode alone, or beside verification rows and another decode: the same bits."""
    model = load_model(Checkpoint(tiny_gguf_target, "t"), kernels=mode)
    alone = logits_of(model, [SeqChunk("a", [9], 6)])
    mixed = logits_of(model, [SeqChunk("b", [4, 5, 6], 3, num_logits=3), SeqChunk("a", [9], 6),
                              SeqChunk("c", [7], 11)])
    assert torch.equal(mixed[3], alone[0])


def test_a_tree_nodes_logits_are_those_of_decoding_its_path(tiny_gguf_target, mode):
    """Node d of the tree a -> {b, c}, c -> d sees a and c at key positions 0 and 2 of the round;
    decoding a, c, d one by one sees them at 0 and 1: the same bits (masked keys are left out)."""
    model = load_model(Checkpoint(tiny_gguf_target, "t"), kernels=mode)
    cache = model.make_cache(64, block_size=4)
    context = list(range(3, 23))
    model(RaggedBatch.build([SeqChunk("s", context, 0)], cache), cache)
    cache.set_cached("s", len(context))
    tree = model(RaggedBatch.build([SeqChunk("s", [40, 41, 42, 43], len(context), parents=[-1, 0, 0, 2],
                                             num_logits=4)], cache), cache)
    for i, token in enumerate([40, 42, 43]):  # the path a, c, d, decoded
        step = model(RaggedBatch.build([SeqChunk("s", [token], len(context) + i)], cache), cache)
        cache.set_cached("s", len(context) + i + 1)
    assert torch.equal(tree[3], step[0])


def test_a_prefill_rows_logits_are_those_of_decoding(tiny_gguf_target, mode):
    """A 40-token prompt prefilled at once (past the C attention's usual 16-row limit) and decoded
    token by token: the same bits at every position."""
    model = load_model(Checkpoint(tiny_gguf_target, "t"), kernels=mode)
    prompt = [3 + (7 * i) % 90 for i in range(40)]
    cache = model.make_cache(64, block_size=4)
    prefill = model(RaggedBatch.build([SeqChunk("p", prompt, 0, num_logits=40)], cache), cache)
    cache = model.make_cache(64, block_size=4)
    for i, token in enumerate(prompt):
        step = model(RaggedBatch.build([SeqChunk("d", [token], i)], cache), cache)
        cache.set_cached("d", i + 1)
        assert torch.equal(prefill[i], step[0]), f"position {i}"


CONFIGS = {"ngram": {"method": "ngram", "num_speculative_tokens": 3},
           "draft_model": {"method": "draft_model", "num_speculative_tokens": 3},
           "topk_tree": {"method": "draft_model", "num_speculative_tokens": 3,
                         "tree": {"kind": "topk", "k": 2, "width": 3}},
           "rsd_c_tree": {"method": "draft_model", "num_speculative_tokens": 3,
                          "tree": {"kind": "rsd_c", "branching": [2, 2, 1]}}}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_speculation_equals_plain_decoding_in_the_fast_mode(peaky_gguf, name, mode):
    target, draft = peaky_gguf
    spec = dict(CONFIGS[name], **({"model": str(draft)} if CONFIGS[name]["method"] == "draft_model" else {}))
    plain = LLM(str(target), kernels=mode, max_num_seqs=16)
    llm = LLM(str(target), speculative_config=spec, kernels=mode, max_num_seqs=16)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ps = prompts(16)
    want = [o.outputs[0].token_ids for o in plain.generate(ps, sp)]
    for batch in (1, 5, 16):
        got = [o.outputs[0].token_ids for g in range(0, 16, batch) for o in llm.generate(ps[g:g + batch], sp)]
        assert got == want, f"batch {batch}"
    outs = llm.generate(ps, sp)
    accepted = [o.metrics.num_accepted_tokens for o in outs]
    assert 0 < sum(accepted) < sum(o.metrics.num_draft_tokens for o in outs) and len(set(accepted)) > 1


def test_seeded_sampling_repeats_alone_or_in_a_batch_in_the_fast_mode(peaky_gguf, mode):
    target, draft = peaky_gguf
    llm = LLM(str(target), speculative_config={"model": str(draft), "num_speculative_tokens": 3}, kernels=mode,
              max_num_seqs=8)
    sp = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=1234, ignore_eos=True)
    others = [{"prompt_token_ids": [1, 5 + i, 9]} for i in range(5)]
    alone = llm.generate(PROMPT, sp)[0].outputs[0].token_ids
    batch = llm.generate([*others[:2], PROMPT, *others[2:]],
                         [SamplingParams(temperature=1.0, max_tokens=15)] * 2 + [sp] + [SamplingParams(temperature=1.0, max_tokens=15)] * 3)
    assert batch[2].outputs[0].token_ids == alone
    reseeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=99, ignore_eos=True)
    assert llm.generate(PROMPT, reseeded)[0].outputs[0].token_ids != alone


def fast_second_token_distribution(folder, mode):
    """P(token 2) = sum_t1 q(t1 | prompt) q(t2 | prompt, t1) from the mode's own logits (numpy [V])."""
    model = load_model(Checkpoint(folder, "t"), kernels=mode)
    ids = PROMPT["prompt_token_ids"]
    vocab = model.config.vocab_size
    cache = model.make_cache(512, block_size=4)
    q1 = model(RaggedBatch.build([SeqChunk("p", ids, 0)], cache), cache)[0].softmax(-1).double()  # [V]
    cache = model.make_cache(512, block_size=4)
    rows = model(RaggedBatch.build([SeqChunk(t, ids + [t], 0) for t in range(vocab)], cache), cache)  # [V, V]
    return (q1.unsqueeze(1) * rows.softmax(-1).double()).sum(0).numpy()


N = 12_000


@pytest.fixture(scope="module", params=FAST_MODES)
def fast_sampling(peaky_gguf, request):
    target, draft = peaky_gguf
    llm = LLM(str(target), speculative_config={"model": str(draft), "num_speculative_tokens": 3},
              kernels=request.param, kv_cache_tokens=65536, max_num_seqs=512)
    return llm, fast_second_token_distribution(target, request.param)


def test_fast_mode_sampling_is_lossless(fast_sampling):
    llm, want = fast_sampling
    torch.manual_seed(0)
    assert chi2(second_tokens(llm, N), want) > 1e-3


def test_fast_mode_negative_control_detected(fast_sampling, monkeypatch):
    llm, want = fast_sampling
    torch.manual_seed(1)
    monkeypatch.setattr(verify, "residual_distribution", lambda q, p: q)
    # a third of the lossless test's samples leaves the control's p-value many orders below the bar
    assert chi2(second_tokens(llm, N // 3), want) < 1e-6


def test_a_diffusion_lm_refuses_the_fast_kernels(tmp_path, mode):
    from diffusion_helpers import save_tiny_dllm

    folder = save_tiny_dllm(tmp_path / "dllm")
    with pytest.raises(ValueError, match="autoregressive GGUF"):
        LLM(str(folder), kernels=mode)
