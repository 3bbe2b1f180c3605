"""Automatic prefix caching changes no output: every token and every logprob bit for bit, in every
kernel mode and with speculation, while later requests take earlier ones' KV blocks."""

import pytest
import torch

from specray import LLM, SamplingParams
from specray.actors.messages import SeqSpec, TargetItem
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig

SYSTEM = [3 + (7 * i) % 90 for i in range(37)]  # a shared "system prompt": 9 full blocks of 4
QUESTIONS = [[50, 51, 52], [60, 61], [70, 71, 72, 73, 74], [50, 51, 53]]
PROMPTS = [SYSTEM + q for q in QUESTIONS]


def engine(folder, caching: bool, spec=None, **kw) -> LLM:
    return LLM(str(folder), speculative_config=spec, block_size=4, enable_prefix_caching=caching, **kw)


def run(llm: LLM, prompts, params) -> list:
    """Each prompt alone (the later ones find the earlier ones' blocks), then all of them together."""
    outs = [llm.generate({"prompt_token_ids": p}, params)[0] for p in prompts]
    return outs + llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def signature(out) -> list:
    return [(c.token_ids, [{t: lp.logprob for t, lp in d.items()} for d in c.logprobs]) for c in out.outputs]


PARAMS = [SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True),
          SamplingParams(temperature=0.9, top_p=0.9, max_tokens=12, logprobs=2, seed=7, n=2, ignore_eos=True),
          # penalties read the prompt's tokens, the cached ones included
          SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, repetition_penalty=1.3, presence_penalty=0.5,
                         ignore_eos=True)]


def assert_same_with_hits(folder, spec=None, **kw) -> None:
    for params in PARAMS:
        cold = run(engine(folder, False, spec, **kw), PROMPTS, params)
        warm = run(engine(folder, True, spec, **kw), PROMPTS, params)
        assert [signature(o) for o in warm] == [signature(o) for o in cold]
        assert [o.num_cached_tokens for o in cold] == [0] * len(cold)
        # the first request finds nothing; each later one the system prompt's 9 blocks at least
        hits = [o.num_cached_tokens for o in warm]
        assert hits[0] == 0 and all(h >= 36 for h in hits[1:]), hits


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3}], ids=["plain", "ngram"])
def test_hf_target_outputs_are_unchanged_by_hits(tiny_target, spec):
    assert_same_with_hits(tiny_target, spec)


@pytest.mark.parametrize("tree", [None, {"kind": "topk", "k": 2, "width": 3}], ids=["chain", "tree"])
def test_draft_model_speculation_is_unchanged_by_hits(tiny_target, tiny_draft, tree):
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 3, **({"tree": tree} if tree else {})}
    assert_same_with_hits(tiny_target, spec)


@pytest.fixture(scope="module")
def tiny_eagle(tmp_path_factory, tiny_target):
    from eagle_helpers import save_tiny_eagle

    return save_tiny_eagle(tmp_path_factory.mktemp("tiny_eagle"), tiny_target, seed=3, noise=0.2)


@pytest.mark.parametrize("method", ["eagle", "longspec"])
def test_drafts_that_read_target_features_get_them_for_hits_too(tiny_target, tiny_eagle, tiny_longspec, method):
    """Eagle reads the target's final hidden state of every token, LongSpec its last-layer KV: a hit
    hands over the kept ones, so the drafts propose what they proposed without the cache (their
    rounds' acceptance is the same, and so are the seeded samples, whose draws follow the drafts)."""
    draft = {"eagle": tiny_eagle, "longspec": tiny_longspec}[method]
    spec = {"method": method, "model": str(draft), "num_speculative_tokens": 3}
    assert_same_with_hits(tiny_target, spec)
    cold, warm = (run(engine(tiny_target, on, spec), PROMPTS, PARAMS[1]) for on in (False, True))
    assert [o.metrics for o in warm] == [o.metrics for o in cold]
    assert any(o.metrics.num_accepted_tokens for o in warm)


def test_a_step_whose_features_cannot_be_kept_commits_nothing(tiny_target, tiny_eagle, monkeypatch):
    """Keeping the features (a store allocated at the first eagle request: an out-of-memory there)
    fails before the step commits: the router retries the request alone, and its output is the one
    without prefix caching."""
    from specray.kernels.kv_cache import PagedKVCache

    spec = {"method": "eagle", "model": str(tiny_eagle), "num_speculative_tokens": 3}
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    write, calls = PagedKVCache.write_features, []

    def flaky(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)")
        return write(self, *a, **k)

    monkeypatch.setattr(PagedKVCache, "write_features", flaky)
    got = engine(tiny_target, True, spec).generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], params)
    monkeypatch.undo()
    want = engine(tiny_target, False, spec).generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], params)
    assert len(calls) > 2 and [signature(o) for o in got] == [signature(o) for o in want]


def test_blocks_without_features_are_not_taken_where_features_are_read(tiny_target, tiny_eagle):
    """A request without speculation leaves blocks without the features an eagle request reads: the
    eagle request computes them (and keeps them), and a second one takes them."""
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    eagle = engine(tiny_target, True, {"method": "eagle", "model": str(tiny_eagle), "num_speculative_tokens": 2})
    eagle.generate({"prompt_token_ids": PROMPTS[0]}, SamplingParams(temperature=0.0, max_tokens=4, n=1, logprobs=0,
                                                                  ignore_eos=True))
    cache = eagle.target.cache
    featured = set(cache.featured)
    assert featured and featured <= set(cache.pool.digest_of)
    cache.featured.clear()  # as a request whose draft reads nothing would have left them
    assert eagle.generate({"prompt_token_ids": PROMPTS[1]}, params)[0].num_cached_tokens == 0
    assert eagle.generate({"prompt_token_ids": PROMPTS[2]}, params)[0].num_cached_tokens >= 36


@pytest.mark.parametrize("kernels", ["exact", "fast"])
def test_packed_kernels_outputs_are_unchanged_by_hits(tiny_gguf_target, kernels):
    assert_same_with_hits(tiny_gguf_target, {"method": "ngram", "num_speculative_tokens": 3}, kernels=kernels)


def test_a_follow_up_turn_finds_the_answers_blocks_too(tiny_gguf_target):
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True, logprobs=1)
    warm, cold = engine(tiny_gguf_target, True), engine(tiny_gguf_target, False)
    first = warm.generate({"prompt_token_ids": PROMPTS[0]}, params)[0]
    answer = first.outputs[0].token_ids
    follow = PROMPTS[0] + answer + [80, 81]
    got = warm.generate({"prompt_token_ids": follow}, params)[0]
    # every full block of the first request's KV: its prompt and its answer but the last token, never fed back
    assert got.num_cached_tokens == (len(PROMPTS[0]) + len(answer) - 1) // 4 * 4
    assert signature(got) == signature(cold.generate({"prompt_token_ids": follow}, params)[0])


def test_chunked_prefill_skips_the_cached_chunks(tiny_target):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    long_prompt = SYSTEM * 3 + [9]  # 112 tokens, prefilled 8 a round
    warm = engine(tiny_target, True, max_prefill_tokens=8)
    cold = engine(tiny_target, False, max_prefill_tokens=8)
    want = signature(cold.generate({"prompt_token_ids": long_prompt}, params)[0])
    assert signature(warm.generate({"prompt_token_ids": long_prompt}, params)[0]) == want
    steps = warm.router.stats.steps
    again = warm.generate({"prompt_token_ids": long_prompt}, params)[0]
    assert again.num_cached_tokens == 108 and signature(again) == want  # all but the last prompt token's block
    # the first chunk's step finds the 108 tokens, the next computes the last 4 and draws; then 7 to decode
    assert warm.router.stats.steps - steps == 2 + 7


def test_prompt_logprobs_compute_every_prompt_token(tiny_target):
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2, ignore_eos=True)
    warm, cold = engine(tiny_target, True), engine(tiny_target, False)
    warm.generate({"prompt_token_ids": PROMPTS[0]}, params)
    got = warm.generate({"prompt_token_ids": PROMPTS[1]}, params)[0]
    want = cold.generate({"prompt_token_ids": PROMPTS[1]}, params)[0]
    assert got.num_cached_tokens == 0
    assert [d and {t: lp.logprob for t, lp in d.items()} for d in got.prompt_logprobs] == \
           [d and {t: lp.logprob for t, lp in d.items()} for d in want.prompt_logprobs]
    # a request without them still finds the blocks the prompt-logprobs requests computed
    assert warm.generate({"prompt_token_ids": PROMPTS[2]}, SamplingParams(max_tokens=2))[0].num_cached_tokens == 36


def test_a_small_cache_evicts_and_still_answers_the_same(tiny_target):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    prompts = [[3 + (i * 13 + j) % 90 for j in range(30)] for i in range(8)] + [PROMPTS[0], PROMPTS[1]]
    warm = engine(tiny_target, True, kv_cache_tokens=96, max_model_len=64)
    cold = engine(tiny_target, False, kv_cache_tokens=96, max_model_len=64)
    got = [warm.generate({"prompt_token_ids": p}, params)[0] for p in prompts + prompts[:2]]
    want = [cold.generate({"prompt_token_ids": p}, params)[0] for p in prompts + prompts[:2]]
    assert [signature(o) for o in got] == [signature(o) for o in want]
    hits = [o.num_cached_tokens for o in got]
    assert hits[9] == 36 and hits[10] == 0, hits  # the last prompts' blocks evicted the first ones'


def test_blocks_computed_again_stay_cached(tiny_target):
    """A request that computes a cached prompt again (its prompt logprobs need every row) leaves its
    own copy cached, though filling the small cache evicted the original meanwhile."""
    warm = engine(tiny_target, True, kv_cache_tokens=96, max_model_len=64)
    p, q = PROMPTS[0][:40], [3 + (i * 11) % 90 for i in range(40)]
    one = SamplingParams(temperature=0.0, max_tokens=1)
    warm.generate([{"prompt_token_ids": p}], one)
    warm.generate([{"prompt_token_ids": q}], one)
    stats = warm.router.stats
    queried = stats.prefix_cache_queries
    out = warm.generate([{"prompt_token_ids": p}], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1))[0]
    assert out.num_cached_tokens == 0 and stats.prefix_cache_queries == queried  # never looked up
    assert warm.generate([{"prompt_token_ids": p}], one)[0].num_cached_tokens == 36
    assert stats.prefix_cache_queries == queried + 40 and stats.prefix_cache_hits == 36


def test_switched_off_nothing_is_shared(tiny_target):
    llm = engine(tiny_target, False)
    run(llm, PROMPTS, PARAMS[0])
    assert llm.target.cache.pool.stats.hit_tokens == 0 and not llm.target.cache.pool.by_digest
    assert llm.router.stats.prefix_cache_queries == llm.router.stats.prefix_cache_hits == 0


def _greedy(prompt, **kw) -> SeqSpec:
    return SeqSpec(SamplingConfig(temperature=0.0), prompt_len=len(prompt), **kw)


def _decode(worker, seq_id, first: int, n: int = 8) -> list[int]:
    out = [first]
    for _ in range(n):
        out.append(worker.step([TargetItem(seq_id, out[-1:], Proposal([]))])[0].next_token_id)
    return out


@pytest.mark.parametrize("where", ["rule", "after_forward"])
def test_a_failed_step_leaves_the_worker_as_it_found_it(tiny_target, where):
    """A bad rule fails before any KV is written; logprobs wider than the vocabulary fail after the
    forward, with the step's blocks reserved: either way the hits and the blocks go back, and the
    retried sequence computes what it computes alone."""
    worker = engine(tiny_target, True).target
    worker.step([TargetItem("a", PROMPTS[0], Proposal([]), spec=_greedy(PROMPTS[0]))])
    worker.step([TargetItem("c", [7, 8, 9], Proposal([]), spec=_greedy([7, 8, 9]))])  # decoding beside
    free, stats = worker.cache.num_free_blocks, (worker.cache.pool.stats.queried_tokens, worker.cache.pool.stats.hit_tokens)
    broken = (TargetItem("x", [5, 6], Proposal([]), spec=_greedy([5, 6]), rule="no-such-rule") if where == "rule" else
              TargetItem("x", [5, 6], Proposal([]), spec=_greedy([5, 6], logprobs=10 ** 6)))
    with pytest.raises((ValueError, RuntimeError)) as failure:
        worker.step([TargetItem("b", PROMPTS[1], Proposal([]), spec=_greedy(PROMPTS[1])),
                     TargetItem("c", [11], Proposal([])), broken])
    assert not isinstance(failure.value, AssertionError)
    worker.release("x")
    assert worker.cache.num_cached("b") == 0 and worker.cache.tables["b"].blocks == []
    assert worker.cache.num_cached("c") == 3 and worker.cache.num_free_blocks == free
    assert (worker.cache.pool.stats.queried_tokens, worker.cache.pool.stats.hit_tokens) == stats
    retried = worker.step([TargetItem("b", PROMPTS[1], Proposal([]), spec=_greedy(PROMPTS[1]))])[0]
    fresh = engine(tiny_target, False).target
    alone = fresh.step([TargetItem("b", PROMPTS[1], Proposal([]), spec=_greedy(PROMPTS[1]))])[0]
    assert retried.num_cached_tokens == 36
    assert _decode(worker, "b", retried.next_token_id) == _decode(fresh, "b", alone.next_token_id)
    n = len(PROMPTS[1]) + 8  # b's KV, shared blocks and computed ones, bit for bit what it computes alone
    assert torch.equal(worker.cache.kv[:, :, worker.cache.slots("b", 0, n)],
                       fresh.cache.kv[:, :, fresh.cache.slots("b", 0, n)])


def test_a_request_whose_step_fails_beside_a_hit_harms_nothing(tiny_target, monkeypatch):
    """Through the router: a forward that fails once (as an out-of-memory would) while a request with
    hits shares the batch; the router retries each request alone and every output is the one
    without prefix caching."""
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    warm, cold = engine(tiny_target, True), engine(tiny_target, False)
    warm.generate({"prompt_token_ids": PROMPTS[0]}, params)
    model, calls = warm.target.model, []
    forward = type(model).forward

    def flaky(self, batch, *a, **k):
        calls.append(batch.batch_size)
        if batch.batch_size == 2 and calls.count(2) == 1:
            raise RuntimeError("out of memory (simulated)")
        return forward(self, batch, *a, **k)

    monkeypatch.setattr(type(model), "forward", flaky)
    got = warm.generate([{"prompt_token_ids": p} for p in PROMPTS[1:3]], params)
    monkeypatch.undo()
    want = cold.generate([{"prompt_token_ids": p} for p in PROMPTS[1:3]], params)
    assert 2 in calls and [signature(o) for o in got] == [signature(o) for o in want]


@pytest.mark.parametrize("flag, want", [([], True), (["--no-enable-prefix-caching"], False),
                                        (["--enable-prefix-caching"], True)])
def test_the_flag_reaches_the_target_workers_spec(flag, want):
    from specray.cluster.cli import build_parser
    from specray.cluster.config.worker_specs import serve_target_spec
    from specray.cluster.serve.cli import resolve_config

    cfg = resolve_config(build_parser().parse_args(["serve", *flag]))
    assert cfg.router.enable_prefix_caching is want and serve_target_spec(cfg).enable_prefix_caching is want


def test_a_setting_that_is_not_a_bool_is_refused(tiny_target):
    with pytest.raises(ValueError, match="enable_prefix_caching must be True or False"):
        LLM(str(tiny_target), enable_prefix_caching="yes")


def test_a_cache_salt_shares_blocks_only_within_its_salt(tiny_target):
    """vLLM's prompt `cache_salt`: a tenant's prompts are found only by requests with its salt (one
    tenant could otherwise time which prompts another sent); outputs do not change."""
    llm = engine(tiny_target, True)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def hit(prompt, salt=None):
        out = llm.generate({"prompt_token_ids": prompt, **({"cache_salt": salt} if salt else {})}, params)[0]
        return out.num_cached_tokens, out.outputs[0].token_ids

    first = hit(PROMPTS[0], "tenant-1")
    assert first[0] == 0
    assert hit(PROMPTS[1])[0] == 0  # unsalted: the salted blocks are not found
    assert hit(PROMPTS[2], "tenant-2")[0] == 0
    assert hit(PROMPTS[3], "tenant-1")[0] == 36  # the same salt finds its system prompt
    assert hit(PROMPTS[0], "tenant-1") == (36, first[1])
    salted = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, cache_salt="tenant-2")
    assert llm.generate({"prompt_token_ids": PROMPTS[0]}, salted)[0].num_cached_tokens == 36
    for salt in ("", "s" * 1025, 5):
        with pytest.raises(ValueError, match="cache_salt"):
            llm.generate({"prompt_token_ids": PROMPTS[0], "cache_salt": salt}, params)
