"""Admission and chunked prefill under a prompt-token budget (`max_prefill_tokens`): a round prefills
at most the budget, a part-prefilled prompt first, then waiting prompts in order, whole where they
fit, a prompt longer than the budget in chunks; the outputs are those of prefilling every prompt whole, token for token and
logprob for logprob (a row's numbers do not depend on its step), in every mode and every router."""

import pytest

from specray import LLM, SamplingParams

from router_helpers import GREEDY, prompts


def record_steps(llm):
    """Spy on the target pool: per step, [(seq_id, new tokens, emits, has spec)] of its prefill items."""
    router, steps = llm.router, []
    submit = router.target.submit_step

    def spy(items):
        prefilling = {s.seq_id for s in router.running if s.prefilling}
        steps.append([(i.seq_id, list(i.new_token_ids), i.emits, i.spec is not None)
                      for i in items if i.seq_id in prefilling])
        return submit(items)

    router.target.submit_step = spy
    return steps


def long_prompts(n):
    """Prompts of 13-40 tokens, so a small budget cuts most of them."""
    return [{"prompt_token_ids": (p["prompt_token_ids"] * 3)[:13 + 9 * i]} for i, p in enumerate(prompts(n))]


@pytest.mark.parametrize("budget", [1, 7, 30])
def test_a_round_prefills_the_budget_in_chunks(tiny_target, budget):
    llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=budget)
    steps = record_steps(llm)
    want = [p["prompt_token_ids"] for p in long_prompts(4)]
    llm.generate(long_prompts(4), SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    sizes = [sum(len(tokens) for _, tokens, _, _ in step) for step in steps]
    assert sum(sizes) == sum(len(p) for p in want) and all(s <= budget for s in sizes)
    by_seq: dict = {}
    for step in steps:
        assert sum(not emits for _, _, emits, _ in step) <= 1, "one prompt part-prefilled at most"
        for seq_id, tokens, emits, spec in step:
            by_seq.setdefault(seq_id, []).append((tokens, emits, spec))
    for chunks, prompt in zip(by_seq.values(), want):
        assert [t for tokens, _, _ in chunks for t in tokens] == prompt
        assert [emits for _, emits, _ in chunks] == [False] * (len(chunks) - 1) + [True]
        assert [spec for _, _, spec in chunks] == [True] + [False] * (len(chunks) - 1)
        sizes = [len(tokens) for tokens, _, _ in chunks]
        assert len(sizes) == 1 if len(prompt) <= budget else all(n == budget for n in sizes[1:-1])
    assert any(len(chunks) > 1 for chunks in by_seq.values())


def test_prompts_that_fit_the_budget_are_never_cut(tiny_target):
    """A prompt no longer than the budget waits for a round it fits whole (cut, its first token
    would come no sooner and its round would be slower)."""
    llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=40)
    steps = record_steps(llm)
    llm.generate(long_prompts(4) * 3, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    items = [item for step in steps for item in step]
    assert len(items) == 12 and all(emits for _, _, emits, _ in items)
    assert max(sum(len(tokens) for _, tokens, _, _ in step) for step in steps) <= 40


def test_no_budget_prefills_every_prompt_whole_in_one_round(tiny_target):
    llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=None)
    steps = record_steps(llm)
    llm.generate(long_prompts(5), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    assert [len(step) for step in steps if step] == [5]
    assert all(emits for step in steps for _, _, emits, _ in step)


def test_decoding_goes_on_beside_a_long_prompt(tiny_target):
    """A running sequence gets a token every round while a long prompt prefills in chunks, and the
    long prompt's request has no output (not an empty one) before its first token."""
    llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=8)
    router = llm.router
    short = router.add_request([1, 5, 9], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    router.step()
    long = router.add_request(list(range(3, 60)), GREEDY)  # 57 tokens: 8 rounds of chunks
    rounds = 0
    while not any(s.output_token_ids for s in router.requests[long].seqs):
        outs = {o.request_id: o for o in router.step()}
        rounds += 1
        assert short in outs and len(outs[short].outputs[0].token_ids) >= 1 + rounds
        assert long not in outs or outs[long].outputs[0].token_ids
    assert rounds == 8


MODES = {
    "exact": lambda t, g: dict(model=str(t)),
    "fast": lambda t, g: dict(model=str(g), kernels="fast"),
    "fast16": lambda t, g: dict(model=str(g), kernels="fast16"),
    "fp16 fixed path": lambda t, g: dict(model=str(t), dtype="float16"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3}])
def test_chunks_do_not_change_outputs(tiny_target, tiny_gguf_target, mode, spec):
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=11, logprobs=2)
    outs = []
    for budget in (None, 1, 7, 40):
        llm = LLM(**MODES[mode](tiny_target, tiny_gguf_target), kv_cache_tokens=8192, max_prefill_tokens=budget,
                  speculative_config=spec)
        done = llm.generate(long_prompts(6), greedy) + llm.generate(long_prompts(3), sampled)
        outs.append([(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in done])
    assert outs[0] == outs[1] == outs[2] == outs[3]


def test_chunks_do_not_change_pipelined_draft_model_outputs(tiny_target, tiny_draft):
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 3}
    outs = []
    for budget in (None, 5):
        llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=budget, speculative_config=spec,
                  pipelined=True)
        assert llm.router.pipeline is not None
        outs.append([o.outputs[0].token_ids for o in llm.generate(long_prompts(6), GREEDY)])
    assert outs[0] == outs[1]


def test_chunks_feed_an_eagle_draft_the_features_of_every_prompt_row(tiny_target, tmp_path):
    """Eagle reads the target's hidden state at every prompt position: the chunks' features join up,
    so its proposals, and their acceptance, are those of a whole prefill."""
    from eagle_helpers import save_tiny_eagle

    eagle = save_tiny_eagle(tmp_path / "eagle", tiny_target, seed=3, noise=0.2)
    spec = {"method": "eagle", "model": str(eagle), "num_speculative_tokens": 3}
    runs = []
    for budget in (None, 6):
        llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=budget, speculative_config=spec)
        done = llm.generate(long_prompts(4), GREEDY)
        runs.append([(o.outputs[0].token_ids, o.metrics.num_accepted_tokens) for o in done])
    assert runs[0] == runs[1]
    assert sum(accepted for _, accepted in runs[0]) > 0


@pytest.mark.parametrize("bad", [0, -5, 2.5, "512"])
def test_a_bad_budget_is_a_clear_error(tiny_target, bad):
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        LLM(str(tiny_target), max_prefill_tokens=bad)


def test_the_default_budget_follows_the_device(tiny_target):
    """max_prefill_tokens "auto" (the default): CPU_PREFILL_TOKENS on a CPU, CPU_DECODING_PREFILL_TOKENS
    of them while other sequences decode; a larger budget on an accelerator (whose step costs about
    the same for hundreds of rows); a number or None as given, for every round."""
    from specray.cluster.config.defaults import (ACCELERATOR_PREFILL_TOKENS, CPU_DECODING_PREFILL_TOKENS,
                                                 CPU_PREFILL_TOKENS, resolve_prefill_tokens)
    from specray.cluster.config.serve import ServeConfig

    config = LLM(str(tiny_target)).router.config
    assert (config.max_prefill_tokens, config.decoding_prefill_tokens) == (CPU_PREFILL_TOKENS,
                                                                           CPU_DECODING_PREFILL_TOKENS) == (256, 64)
    assert (config.prefill_budget(decoding=False), config.prefill_budget(decoding=True)) == (256, 64)
    assert LLM(str(tiny_target), max_prefill_tokens=100).router.config.prefill_budget(decoding=True) == 100
    for device, budgets in (("cpu", (256, 64)), ("cpu:0", (256, 64)), ("cuda", (ACCELERATOR_PREFILL_TOKENS, None)),
                            ("cuda:1", (512, None))):
        assert resolve_prefill_tokens("auto", device) == budgets
    assert ServeConfig.from_dict({}).router.max_prefill_tokens == "auto"  # resolved where the router is built
    for given in (None, 7):
        assert resolve_prefill_tokens(given, "cpu") == (given, None)
        cfg = ServeConfig.from_dict({"router": {"max_prefill_tokens": given}, "pools": {"target": {"device": "cuda"}}})
        assert cfg.router.max_prefill_tokens == given


def test_a_round_beside_decoding_sequences_prefills_at_most_its_decoding_budget(tiny_target):
    """With sequences decoding, a round prefills at most `decoding_prefill_tokens` (each of them waits
    for the round); with none decoding, the whole budget. Outputs are those of whole prompts."""
    import dataclasses

    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    first, second = list(range(3, 60)), list(range(5, 62))  # 57 tokens each
    whole = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=None)
    want = [o.outputs[0].token_ids for o in whole.generate([{"prompt_token_ids": p} for p in (first, second)],
                                                           params)]
    llm = LLM(str(tiny_target), kv_cache_tokens=8192)
    router = llm.router
    router.config = dataclasses.replace(router.config, max_prefill_tokens=30, decoding_prefill_tokens=8)
    steps = record_steps(llm)
    ids = [router.add_request(first, params)]
    router.step()
    router.step()  # 30 then 27 tokens: nothing decodes beside them
    ids.append(router.add_request(second, params))  # the first decodes now: 8 a round
    finals = {}
    while router.has_unfinished():
        finals.update((o.request_id, o) for o in router.step() if o.finished)
    chunks: dict = {}
    for step in steps:
        for seq_id, tokens, _, _ in step:
            chunks.setdefault(seq_id, []).append(len(tokens))
    assert list(chunks.values()) == [[30, 27], [8] * 7 + [1]]
    assert [finals[i].outputs[0].token_ids for i in ids] == want


@pytest.mark.parametrize("caching", [True, False])
def test_a_requests_later_choices_are_charged_what_the_prefix_cache_leaves(tiny_target, caching):
    """n = 4 choices of a 30-token prompt under a 40-token budget: the first prefills it; with prefix
    caching the other three, which find its full blocks, start together in the next round (2 tokens
    each to compute); without it they take a round each. Outputs are the same either way."""
    prompt = {"prompt_token_ids": (prompts(1)[0]["prompt_token_ids"] * 8)[:30]}
    params = SamplingParams(temperature=0.8, seed=3, n=4, max_tokens=4, ignore_eos=True)
    llm = LLM(str(tiny_target), block_size=4, max_prefill_tokens=40, enable_prefix_caching=caching)
    steps = record_steps(llm)
    out = llm.generate(prompt, params)[0]
    admitted = [sorted(seq_id for seq_id, _, _, spec in step if spec) for step in steps if step]
    if caching:
        assert [len(a) for a in admitted] == [1, 3] and out.num_cached_tokens == 28
    else:
        assert [len(a) for a in admitted] == [1, 1, 1, 1]
    alone = LLM(str(tiny_target), block_size=4, enable_prefix_caching=False, max_prefill_tokens=None)
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in alone.generate(prompt, params)[0].outputs]
