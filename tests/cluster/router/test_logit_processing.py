"""min_p, logit_bias, allowed_token_ids, bad_words, the penalties and min_tokens, each as its
verification needs: exact tiny cases of the
processing (penalties against transformers' too), greedy speculative output equal to greedy plain
output (ngram, draft model, trees, batch 1-16), and chi-square tests of the speculative second token
against the processed target distribution, with negative controls (the target's rows left
unbiased, or unpenalised) that the tests must catch."""

import math

import pytest
import torch

from specray import LLM, SamplingParams
from dataclasses import replace

from specray.cluster.router.bad_words import bad_words_token_ids
from specray.kernels.penalties import RowHistory, apply_bad_words, apply_min_tokens, penalize_row, row_histories
from specray.kernels.sampling import SamplingConfig, apply_logit_bias, processed_probs
from specray.kernels.verify import batch as verify_batch_module

from router_helpers import GREEDY, PROMPT, chi2, prompts

N = 12_000
BIAS = {5: 2.0, 9: -100.0, 11: 2.0}  # favoured tokens, and a banned one; 11 is also the stop token
STOP, MIN_TOKENS = 11, 2  # min_tokens keeps it from the first two tokens
EXCLUDED = {1, 3, 7, 13, 15, 17, 19}  # not in allowed_token_ids
BAD = ["w5"]  # favoured by the bias, so its ban moves the distribution (longer words: the cases below)


def test_min_p_keeps_tokens_within_its_ratio_of_the_most_likely_after_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -5.0], [0.0, 0.0, 0.0, 0.0]])
    got = processed_probs(logits, [SamplingConfig(1.0, min_p=0.3), SamplingConfig(0.5, min_p=1.0)])
    e = math.exp(-1)
    assert torch.allclose(got[0], torch.tensor([1 / (1 + e), e / (1 + e), 0.0, 0.0]))
    assert torch.allclose(got[1], torch.full((4,), 0.25))  # ties with the most likely all stay
    halved = processed_probs(logits[:1], [SamplingConfig(0.5, min_p=0.3)])  # temperature first: 1 drops
    assert halved[0, 1] == 0 and halved[0, 0] == 1
    greedy = processed_probs(logits[:1], [SamplingConfig(0.0, min_p=0.9)])
    assert greedy[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_logit_bias_adds_to_each_row_of_its_own_sequence_only():
    logits = torch.zeros(3, 6)
    configs = [SamplingConfig(0.0, logit_bias=((2, 1.5), (4, -3.0))), SamplingConfig(1.0), SamplingConfig(0.0)]
    got = apply_logit_bias(logits, configs)
    assert got[0].tolist() == [0, 0, 1.5, 0, -3.0, 0] and not got[1:].any() and not logits.any()
    rest = logits[1:]
    assert apply_logit_bias(rest, configs[1:]) is rest  # nothing to add: no copy


def test_the_draft_gets_the_sampling_every_transport_carries():
    cfg = SamplingParams(temperature=0.7, top_p=0.9, min_p=0.1, logit_bias={3: 1.0, 4: 0.0}).sampling_config()
    assert cfg.logit_bias == ((3, 1.0),) and cfg.for_draft() == SamplingConfig(0.7, 0, 0.9)


def test_penalties_of_a_row_by_hand():
    row = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
    cfg = SamplingConfig(1.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = penalize_row(row, cfg, RowHistory(prompt=(0,), output=(1, 3, 3)))
    # 0: prompt only, 2 / 2; 1: output once, -1 * 2 - 0.5 - 0.25; 3: twice, 3 / 2 - 1.0 - 0.25; others kept
    assert got.tolist() == [1.0, -2.75, 0.5, 0.25, 0.0] and row[0] == 2.0
    plain = SamplingConfig(1.0)
    assert not plain.penalized and penalize_row(row, plain, RowHistory((0,), (1,))).tolist() == row.tolist()


def test_row_histories_follow_each_rows_path():
    chain = row_histories(2, [7, 8, 9], [-1, 0, 1], [4, 5, 6])
    assert [(h.prompt, h.output) for h in chain] == [((7, 8), (9,)), ((7, 8), (9, 4)), ((7, 8), (9, 4, 5)),
                                                      ((7, 8), (9, 4, 5, 6))]
    tree = row_histories(3, [7, 8, 9], [-1, -1, 0], [4, 5, 6])  # the prompt's last row: no output yet
    assert [h.output for h in tree] == [(), (4,), (5,), (4, 6)] and tree[0].prompt == (7, 8, 9)


def test_greedy_repetition_penalty_matches_transformers(tiny_target):
    from transformers import AutoModelForCausalLM

    ids = prompts(1)[0]["prompt_token_ids"]
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, repetition_penalty=1.8,
                              min_new_tokens=20, pad_token_id=0)[0, len(ids):].tolist()
    plain = LLM(str(tiny_target)).generate({"prompt_token_ids": ids}, GREEDY)[0].outputs[0].token_ids[:20]
    got = LLM(str(tiny_target)).generate({"prompt_token_ids": ids}, SamplingParams(
        temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.8))[0].outputs[0].token_ids
    assert got == want != plain


# -- greedy: speculative = plain, with the bias and penalties ----------------------------------------
@pytest.fixture(scope="module")
def biased_reference(tiny_target):
    llm = LLM(str(tiny_target), kv_cache_tokens=8192)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts(16), GREEDY)]
    banned = {plain[0][0]: -100.0, plain[1][2]: 3.0}
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logit_bias=banned, min_p=0.2,
                            repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)
    biased = [o.outputs[0].token_ids for o in llm.generate(prompts(16), params)]
    assert biased != plain and plain[0][0] not in biased[0]  # the bias changes the greedy path
    return params, biased


@pytest.mark.parametrize("method", ["ngram", "draft_model", "tree"])
def test_greedy_speculative_equals_plain_with_logit_bias(tiny_target, tiny_draft, biased_reference, method):
    params, want = biased_reference
    cfg = {"method": "ngram" if method == "ngram" else "draft_model", "num_speculative_tokens": 3}
    if method != "ngram":
        cfg["model"] = str(tiny_draft)
    if method == "tree":
        cfg["tree"] = {"kind": "topk", "k": 2, "width": 2}
    llm = LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=8192)
    for batch in (1, 16):
        outs = llm.generate(prompts(batch), params)
        assert [o.outputs[0].token_ids for o in outs] == want[:batch]
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


# -- sampled: the speculative second token has the processed target distribution --------------------
def processed_second_token_distribution(llm, cfg: SamplingConfig):
    """P(token 2) = sum_t1 p(t1 | prompt) p(t2 | prompt, t1), p the processed target distribution
    (row t1's penalties read the output [t1])."""
    from transformers import AutoModelForCausalLM

    ids = PROMPT["prompt_token_ids"]
    model = AutoModelForCausalLM.from_pretrained(llm.model_name, dtype=torch.float32).eval()

    def p(logits, outputs):  # [rows, vocab], the output before each row
        configs = [cfg] * logits.shape[0]
        rows = apply_logit_bias(logits, configs)
        histories = [RowHistory(tuple(ids), o) for o in outputs]
        rows = torch.stack([penalize_row(r, cfg, h) for r, h in zip(rows, histories)])
        rows = apply_bad_words(rows, configs, histories)
        return processed_probs(apply_min_tokens(rows, configs, histories), configs).double()

    with torch.no_grad():
        p1 = p(model(torch.tensor([ids])).logits[0, -1:], [()])[0]  # [vocab]
        vocab = p1.shape[0]
        p2 = p(model(torch.tensor([ids + [t] for t in range(vocab)])).logits[:, -1], [(t,) for t in range(vocab)])
    return (p1.unsqueeze(1) * p2).sum(0).numpy()  # p2 [vocab, vocab]


@pytest.fixture(scope="module")
def processed(peaky_models):
    llm = LLM(str(peaky_models[0]), speculative_config={"model": str(peaky_models[1]), "num_speculative_tokens": 3},
              kv_cache_tokens=65536, max_num_seqs=512)
    allowed = [t for t in range(llm.router.config.vocab_size) if t not in EXCLUDED]
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, min_p=0.02, logit_bias=BIAS,
                            allowed_token_ids=allowed,
                            repetition_penalty=1.6, frequency_penalty=1.0, presence_penalty=0.5,
                            min_tokens=MIN_TOKENS, stop_token_ids=[STOP], bad_words=BAD)
    cfg = replace(params.sampling_config(), min_tokens=MIN_TOKENS, stop_ids=(STOP,),  # ignore_eos: no EOS
                  bad_words_ids=bad_words_token_ids(llm.get_tokenizer(), BAD))
    return llm, params, processed_second_token_distribution(llm, cfg)


def second_tokens(llm, params):
    outs = llm.generate([PROMPT] * N, params)
    assert all(len(o.outputs[0].token_ids) >= MIN_TOKENS for o in outs)
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0.1 * drafted < accepted < 0.9 * drafted, "the test needs frequent acceptance and rejection"
    tokens = torch.tensor([o.outputs[0].token_ids[1] for o in outs])
    assert not (tokens == 9).any() and not (tokens == STOP).any()  # banned, and held back by min_tokens
    assert not any(t in EXCLUDED or t == 5 for t in tokens.tolist())  # not allowed, or a bad word
    return tokens.numpy()


def test_sampling_with_min_p_logit_bias_and_penalties_is_lossless(processed):
    llm, params, want = processed
    torch.manual_seed(0)
    assert chi2(second_tokens(llm, params), want) > 1e-3


# samples: without the bias and mask p = 1e-31 at a third of N (seed 1), without the penalties 1e-8 at N
@pytest.mark.parametrize("stage, seed, samples", [("apply_logit_bias", 1, N // 3), ("apply_penalties", 3, N)])
def test_negative_control_a_target_that_skips_a_stage_is_caught(processed, monkeypatch, stage, seed, samples):
    """The bias and allowed-token mask (apply_logit_bias), or the penalties, left out of the target's rows."""
    llm, params, want = processed
    torch.manual_seed(seed)
    monkeypatch.setattr(verify_batch_module, stage, lambda logits, configs, *rows: logits)
    outs = llm.generate([PROMPT] * samples, params)
    assert chi2(torch.tensor([o.outputs[0].token_ids[1] for o in outs]).numpy(), want) < 1e-6


def test_negative_control_a_target_that_ignores_min_tokens_is_caught(processed, monkeypatch):
    llm, params, want = processed
    torch.manual_seed(4)
    monkeypatch.setattr(verify_batch_module, "apply_min_tokens", lambda logits, configs, rows: logits)
    # a third of the lossless test's samples: without the mask about 1 % of them stop early
    outs = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * (N // 3), params)]
    stopped_early = sum(len(t) < MIN_TOKENS for t in outs)  # the stop token drawn first
    assert stopped_early > 10  # never under min_tokens (the lossless test checks none did)


def test_min_tokens_masks_the_stop_ids_of_short_rows_only():
    logits = torch.zeros(3, 5)
    cfg = SamplingConfig(0.0, min_tokens=2, stop_ids=(1, 3))
    rows = [RowHistory((), (7,)), RowHistory((), (7, 8)), RowHistory((), ())]
    got = apply_min_tokens(logits, [cfg, cfg, SamplingConfig(0.0)], rows)
    inf = float("-inf")
    assert got.tolist() == [[0, inf, 0, inf, 0], [0] * 5, [0] * 5] and not logits.isinf().any()


@pytest.fixture(scope="module")
def greedy_stops(tiny_target):
    """A greedy output, and a token and a word of it early on, to stop at."""
    llm = LLM(str(tiny_target), kv_cache_tokens=8192)
    out = llm.generate(prompts(1), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    return llm, out


@pytest.mark.parametrize("method", [None, "ngram", "draft_model"])
def test_min_tokens_holds_back_stop_tokens_and_strings_losslessly(tiny_target, tiny_draft, greedy_stops, method):
    plain, free = greedy_stops
    stop_token, word = free.token_ids[1], free.text.split()[1]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, min_tokens=6, stop_token_ids=[stop_token]),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, min_tokens=6, stop=[word])]
    want = [o.outputs[0] for o in plain.generate(prompts(1) * 2, params)]
    assert stop_token not in want[0].token_ids[:6] and len(want[0].token_ids) > 6  # not drawn before 6 tokens
    # the stop string ends it only where it completes at token 6 or later: earlier ones stay in the text
    assert want[1].stop_reason == word and len(want[1].token_ids) >= 6 and word in want[1].text
    if method is None:
        return
    cfg = {"method": method, "num_speculative_tokens": 3, **({"model": str(tiny_draft)} if method != "ngram" else {})}
    got = LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=8192).generate(prompts(1) * 2, params)
    assert [o.outputs[0].token_ids for o in got] == [w.token_ids for w in want]


def test_allowed_token_ids_keep_only_theirs_before_the_bias():
    logits = torch.zeros(2, 5)
    cfg = SamplingConfig(0.0, logit_bias=((4, 1.0),), allowed_token_ids=(1, 4))
    got = apply_logit_bias(logits, [cfg, SamplingConfig(0.0)])
    inf = float("-inf")
    assert got.tolist() == [[inf, 0, inf, inf, 1.0], [0] * 5]


def test_a_steps_bias_and_masks_equal_row_by_row_processing():
    """Rows sharing one config (a request's verification rows), others with their own id tuples, all
    processed in one pass: each row as if processed alone."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 40, generator=gen)
    shared = SamplingConfig(1.0, logit_bias=((3, 2.0), (7, -1.0)), allowed_token_ids=tuple(range(0, 40, 2)))
    configs = [shared, shared, SamplingConfig(0.0, allowed_token_ids=tuple(range(0, 40, 2))), SamplingConfig(1.0),
               SamplingConfig(1.0, logit_bias=((3, -4.0),)), shared, SamplingConfig(0.5, allowed_token_ids=(5, 9)),
               SamplingConfig(1.0, logit_bias=((39, 1.0), (0, 0.5)), allowed_token_ids=(0, 39)), SamplingConfig(0.0)]
    got = apply_logit_bias(logits, configs)
    for i, cfg in enumerate(configs):
        want = logits[i].clone()
        if cfg.allowed_token_ids:
            want[[t for t in range(40) if t not in cfg.allowed_token_ids]] = float("-inf")
        for t, b in cfg.logit_bias:
            want[t] += b
        assert torch.equal(got[i], want), i


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_speculative_equals_plain_with_allowed_token_ids(tiny_target, tiny_draft, greedy_stops, method):
    plain, _ = greedy_stops
    even = list(range(0, plain.router.config.vocab_size, 2))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, allowed_token_ids=even)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts(3), params)]
    assert all(t % 2 == 0 for w in want for t in w)
    cfg = {"method": method, "num_speculative_tokens": 3, **({"model": str(tiny_draft)} if method != "ngram" else {})}
    got = LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=8192).generate(prompts(3), params)
    assert [o.outputs[0].token_ids for o in got] == want


def test_negative_control_a_target_that_ignores_bad_words_is_caught(processed, monkeypatch):
    llm, params, want = processed
    torch.manual_seed(5)
    monkeypatch.setattr(verify_batch_module, "apply_bad_words", lambda logits, configs, rows: logits)
    # a quarter of the lossless test's samples: without the ban about 5 % of them draw the bad word
    outs = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * (N // 4), params)]
    assert sum(5 in t[:2] for t in outs) > 10  # never with the bad word's ban


def test_bad_words_ban_a_last_token_after_the_others_only():
    cfg = SamplingConfig(0.0, bad_words_ids=((2,), (3, 4)))
    rows = [RowHistory((), (3,)), RowHistory((3,), (1,)), RowHistory((), ())]
    got = apply_bad_words(torch.zeros(3, 5), [cfg, cfg, SamplingConfig(0.0)], rows)
    inf = float("-inf")
    assert got.tolist() == [[0, 0, inf, 0, inf], [0, 0, inf, 0, 0], [0] * 5]  # the prompt does not count


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_speculative_equals_plain_with_bad_words(tiny_target, tiny_draft, greedy_stops, method):
    plain, free = greedy_stops
    pair = free.token_ids[:2]  # the plain output's first two tokens, as a bad word
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=[f"w{pair[0]} w{pair[1]}"])
    want = [o.outputs[0].token_ids for o in plain.generate(prompts(3), params)]
    assert want[0][:2] != pair and not any(w[i:i + 2] == pair for w in want for i in range(len(w)))
    cfg = {"method": method, "num_speculative_tokens": 3, **({"model": str(tiny_draft)} if method != "ngram" else {})}
    got = LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=8192).generate(prompts(3), params)
    assert [o.outputs[0].token_ids for o in got] == want


def test_seeded_processed_requests_reproduce_alone_or_in_a_batch(tiny_target, tiny_draft):
    """Seeded determinism with every option: the same draws alone, again, and beside other requests."""
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3},
              kv_cache_tokens=8192)
    params = SamplingParams(temperature=1.0, seed=17, max_tokens=16, ignore_eos=True, n=2, min_p=0.05,
                            logit_bias={5: 1.0}, repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.2,
                            min_tokens=4, stop_token_ids=[9], bad_words=["w7"])
    alone = [c.token_ids for c in llm.generate(prompts(1), params)[0].outputs]
    again = [c.token_ids for c in llm.generate(prompts(1), params)[0].outputs]
    batch = llm.generate(prompts(4), [params] + [SamplingParams(temperature=1.0, max_tokens=16)] * 3)
    assert alone == again == [c.token_ids for c in batch[0].outputs] and alone[0] != alone[1]
