"""The pipelined router (two groups in flight) and load-adaptive speculation length: neither may
change a single output token."""

import pytest

from specray import LLM, SamplingParams
from specray.cluster.config.speculative import SpeculativeConfig
from specray.cluster.router.limits import RouterLimits

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def prompts(n):
    return [{"prompt_token_ids": [1] + [3 + (i * 7 + j * 13) % 90 for j in range(3 + i % 4)] * (1 + i % 3)}
            for i in range(n)]


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = LLM(str(tiny_target), kv_cache_tokens=8192)
    return [o.outputs[0].token_ids for o in llm.generate(prompts(16), GREEDY)]


def draft_llm(tiny_target, tiny_draft, **kw):
    cfg = {"model": str(tiny_draft), "num_speculative_tokens": 3, **kw.pop("spec", {})}
    return LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=8192, **kw)


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_pipelined_greedy_equals_non_speculative(tiny_target, tiny_draft, reference, batch):
    llm = draft_llm(tiny_target, tiny_draft, pipelined=True)
    outs = llm.generate(prompts(batch), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference[:batch]
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


def test_pipelined_continuous_batching(tiny_target, tiny_draft, reference):
    llm = draft_llm(tiny_target, tiny_draft, pipelined=True, max_num_seqs=5)
    params = [SamplingParams(temperature=0.0, max_tokens=3 + (i * 5) % 18, ignore_eos=True) for i in range(16)]
    outs = llm.generate(prompts(16), params)
    for o, p, ref in zip(outs, params, reference):
        assert o.outputs[0].token_ids == ref[: p.max_tokens]


def test_pipeline_keeps_two_even_groups_in_flight(tiny_target, tiny_draft):
    llm = draft_llm(tiny_target, tiny_draft, pipelined=True)
    for p in prompts(8):
        llm.router.add_request(p["prompt_token_ids"], GREEDY)
    sizes = []
    for _ in range(6):
        llm.router.step()
        pipe = llm.router.pipeline
        sizes.append((len(pipe.verifying[0]) if pipe.verifying else 0, len(pipe.drafting[0]) if pipe.drafting else 0))
    assert sizes[0] == (4, 0) and all(s == (4, 4) for s in sizes[1:]), sizes


def test_pipelined_sampling_is_seeded(tiny_target, tiny_draft):
    """A lone sequence sees the same batches pipelined or not, so its seeded draws are identical;
    a pipelined batch reproduces itself run after run. (Across different batch compositions the
    fp32 GEMMs round differently, so draws may differ in rare near-ties; the chi-square test in
    test_engine_sampling checks the pipelined distribution.)"""
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=10 + i, max_tokens=16, ignore_eos=True)
              for i in range(6)]
    sync, piped = draft_llm(tiny_target, tiny_draft), draft_llm(tiny_target, tiny_draft, pipelined=True)
    for p, sp in zip(prompts(3), params):
        assert piped.generate(p, sp)[0].outputs[0].token_ids == sync.generate(p, sp)[0].outputs[0].token_ids
    runs = [[o.outputs[0].token_ids for o in piped.generate(prompts(6), params)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_schedule_caps_speculation_by_load():
    cfg = RouterLimits(max_model_len=64, vocab_size=10, kv_capacity_tokens=1024, num_speculative_tokens=4,
                       speculation_schedule=SpeculativeConfig(num_speculative_tokens=4, batch_size_schedule=[[4, 2], [8, 1]],
                                                              disable_by_batch_size=12).schedule())
    assert [cfg.draft_cap(n) for n in (1, 3, 4, 7, 8, 11, 12, 40)] == [4, 4, 2, 2, 1, 1, 0, 0]


@pytest.mark.parametrize("bad", [[[4, 5]], [[8, 1], [4, 2]], [[0, 1]], [4, 1], [["a", 1]]])
def test_bad_schedule_is_rejected(bad):
    with pytest.raises(ValueError, match="batch_size_schedule"):
        SpeculativeConfig(num_speculative_tokens=4, batch_size_schedule=bad)


def test_speculation_off_under_load_defers_calibration_then_catches_up(tiny_target, tiny_draft, reference):
    """While 2+ sequences run nothing is drafted and the draft pool is not called at all; the round
    the survivor drafts again it sends its whole history, so it speculates from an exact draft state."""
    llm = draft_llm(tiny_target, tiny_draft, spec={"batch_size_schedule": [[2, 0]]})
    params = [SamplingParams(temperature=0.0, max_tokens=20 if i == 0 else 6, ignore_eos=True) for i in range(4)]
    for p, sp in zip(prompts(4), params):
        llm.router.add_request(p["prompt_token_ids"], sp)
    pool, sent = llm.router.draft, []
    submit = pool.submit_propose
    pool.submit_propose = lambda items: (sent.append([(i.seq_id, list(i.committed_delta), i.spec) for i in items]),
                                         submit(items))[1]
    outs, first_contact = {}, None
    while llm.router.has_unfinished():
        loaded, calls = len(llm.router.running) >= 2, len(sent)
        survivor = llm.router.requests["0"].seqs[0]
        history = list(survivor.token_ids)
        for o in llm.router.step():
            outs[o.request_id] = o
        if loaded:
            assert len(sent) == calls, "a round with speculation off calls no draft"
        elif len(sent) > calls and first_contact is None:
            first_contact = sent[-1]
            assert first_contact == [(survivor.seq_id, history, first_contact[0][2])] and first_contact[0][2] is not None
    assert first_contact is not None and llm.router.stats.num_draft_tokens > 0
    assert outs["0"].outputs[0].token_ids == reference[0][:20]
    assert outs["0"].metrics.num_draft_tokens > 0 and outs["0"].metrics.num_accepted_tokens > 0


def test_pool_resources_default_per_pool():
    """A pool block that sets only other keys keeps its pool's resource (else workers land anywhere)."""
    from specray.cluster.config.serve import ServeConfig

    cfg = ServeConfig.from_dict({"pools": {"draft": {"threads": 1}, "target": {"num_cpus": 2}}})
    assert cfg.pools.draft.resources == {"draft": 1} and cfg.pools.target.resources == {"target": 1}


def test_rebalancing_never_takes_a_seeded_sampled_sequences_drafts():
    """A sequence moved to the verifying group runs a round without drafts: a seeded sampled one
    would then draw differently, its tokens depending on which others finished."""
    from types import SimpleNamespace

    from specray.cluster.router.pipeline import Pipeline

    drafting = [SimpleNamespace(name=i, reproducible=i >= 3) for i in range(6)]  # 3, 4, 5 are seeded
    verifying = []
    moved = Pipeline._rebalance(drafting, verifying)
    assert [s.name for s in moved] == [0, 1, 2] and verifying == moved
    assert Pipeline._rebalance([SimpleNamespace(reproducible=True)] * 4, []) == []


def test_abort_between_pipelined_slots_frees_the_target_kv(tiny_target, tiny_draft):
    """In process (and `pools.colocate`) a group's step runs when its result is first asked for,
    after the next slot's submit: a sequence aborted in between is released before the step that
    creates its KV runs, and nothing may keep that KV afterwards."""
    llm = draft_llm(tiny_target, tiny_draft, pipelined=True)
    router, worker = llm.router, llm.router.target.worker
    free = worker.cache.num_free_blocks
    ids = [router.add_request(p["prompt_token_ids"], GREEDY) for p in prompts(6)]
    router.step()
    router.step()
    late = router.add_request(prompts(7)[6]["prompt_token_ids"], GREEDY)
    router.step()  # the late request's first group is submitted, its step not yet run
    router.abort(late)
    while router.has_unfinished():
        router.step()
    assert not worker.seqs and worker.cache.num_free_blocks == free, (ids, worker.seqs.keys())


def test_a_failed_draft_call_still_releases_its_sequences_on_the_draft_side(tiny_target, tiny_draft):
    """After a draft call fails (a draft bug, not a restart) every running sequence resends its whole
    history next time; one that finishes before drafting again must still be released where the draft
    worker kept its state and cache."""
    llm = draft_llm(tiny_target, tiny_draft)
    router, worker = llm.router, llm.router.draft.worker
    propose, calls = worker.propose, []

    def failing_once(items):
        calls.append(len(items))
        if len(calls) == 3:
            raise RuntimeError("a draft bug")
        return propose(items)

    worker.propose = failing_once
    short = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ids = [router.add_request(p["prompt_token_ids"], short) for p in prompts(3)]
    while router.has_unfinished():
        router.step()
    assert router.stats.draft_fallbacks == 1 and len(calls) >= 3, calls
    assert not worker.seqs, (ids, worker.seqs.keys())


def test_a_draft_over_another_vocabulary_costs_speed_not_requests(tiny_target, tiny_draft):
    """A gRPC drafter started with another model passed its ping; its distributions, narrower than
    the target's vocabulary, failed every sampled request at the first rejection."""
    from dataclasses import replace

    llm = draft_llm(tiny_target, tiny_draft)
    router, worker = llm.router, llm.router.draft.worker
    propose = worker.propose

    def narrower(items):
        return [replace(p, draft_probs=None if p.draft_probs is None else p.draft_probs[:, :-2])
                for p in propose(items)]

    worker.propose = narrower
    sampled = SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
    outs = llm.generate(prompts(3), sampled)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    assert router.stats.draft_fallbacks >= 1 and sum(o.metrics.num_draft_tokens for o in outs) == 0
