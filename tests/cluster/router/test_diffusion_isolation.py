"""A request that makes the diffusion worker raise fails alone, as an autoregressive one does: the
call changed no canvas and kept none of the sequences it started, so the router retries it one
sequence at a time; the others' outputs stay token for token (greedy and seeded)."""

import pytest
from diffusion_helpers import save_tiny_dllm

from specray import LLM, SamplingParams
from specray.cluster.router.failures import RequestFailed

BAD = [5, 50]  # the poisoned request's prompt: its canvas starts with it
PROMPTS = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
PARAMS = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
          SamplingParams(temperature=0.9, seed=7, max_tokens=24, ignore_eos=True)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_dllm(tmp_path_factory.mktemp("llada"), "llada", scale=6.0)


def _poison_forward(llm):
    """The shared model call fails for a batch that holds the poisoned prompt."""
    forward = llm.target.model.forward

    def poisoned(canvases, windows):
        if any(c[:2].tolist() == BAD for c in canvases):
            raise RuntimeError("worker bug")
        return forward(canvases, windows)
    llm.target.model.forward = poisoned


def _poison_acceptance(llm):
    """One sequence's acceptance fails after the call scored every draft (others judged first
    would have advanced had the engine committed them one by one)."""
    engine = llm.target.engine
    accepted = engine._accepted

    def poisoned(s, drafts, scores):
        if drafts and s.canvas[:2].tolist() == BAD:
            raise RuntimeError("worker bug")
        return accepted(s, drafts, scores)
    engine._accepted = poisoned


def _run(llm, params):
    router = llm.router
    good = [router.add_request(p, params) for p in PROMPTS[:2]]
    outputs = {}
    for _ in range(2):  # the good ones are mid-canvas when the bad one joins their call
        outputs.update({o.request_id: o for o in router.step()})
    bad = router.add_request(BAD, params)
    late = router.add_request(PROMPTS[2], params)  # started by the same failing call
    failures = []
    while router.has_unfinished():
        outputs.update({o.request_id: o for o in router.step()})
        failures += router.take_failures()
    return [outputs[r].outputs[0].token_ids for r in (*good, late)], bad, failures


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded"])
@pytest.mark.parametrize("poison", [_poison_forward, _poison_acceptance], ids=["forward", "acceptance"])
def test_a_worker_error_fails_only_its_request(folder, params, poison):
    config = dict(speculative_config={"method": "freedave", "num_drafts": 3}, diffusion_config={"block_length": 8})
    want = LLM(str(folder), **config).generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    llm = LLM(str(folder), **config)
    poison(llm)
    got, bad, failures = _run(llm, params)
    assert [rid for rid, _ in failures] == [bad] and isinstance(failures[0][1], RequestFailed)
    assert failures[0][1].__cause__.args == ("worker bug",)
    assert got == [w.outputs[0].token_ids for w in want]
    assert not llm.router.requests and not llm.router.started and not llm.target.engine.seqs


def test_a_router_error_is_not_taken_for_a_worker_error(folder):
    """An error committing a call's updates is the router's: isolating it would step the canvases the
    worker had advanced a second time, and fail requests the worker holds as new ones."""
    llm = LLM(str(folder), diffusion_config={"block_length": 8})
    router = llm.router
    for p in PROMPTS[:2]:
        router.add_request(p, PARAMS[0])
    router.step()

    def broken(seq, update):
        raise RuntimeError("router bug")
    router._commit = broken
    with pytest.raises(RuntimeError, match="router bug"):
        router.step()
    assert not router.take_failures()
