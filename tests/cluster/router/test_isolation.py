"""A request that makes the target worker raise fails alone: the router retries the round for the
others one sequence at a time, in plain and pipelined rounds; their outputs stay token for token."""

import pytest

from specray import LLM, SamplingParams
from specray.cluster.router.failures import RequestFailed

POISON = 96
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 9, 14, 5, 9], [7, 3, 7, 3, 7, 3], [11, 12, 13]]


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_worker_error_fails_only_its_request(tiny_target, tiny_draft, pipelined):
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 3}
    want = LLM(str(tiny_target), speculative_config=spec).generate(
        [{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    llm = LLM(str(tiny_target), speculative_config=spec, pipelined=pipelined)
    step = llm.target.step

    def poisoned(items):
        if any(item.spec is not None and POISON in item.new_token_ids for item in items):
            raise RuntimeError("worker bug")
        return step(items)
    llm.target.step = poisoned
    router = llm.router
    good = [router.add_request(p, GREEDY) for p in PROMPTS[:2]]
    outputs = {}
    for _ in range(3):  # the good ones are mid-decode when the bad one joins their batch
        outputs.update({o.request_id: o for o in router.step()})
    bad = router.add_request([5, POISON], GREEDY)
    late = router.add_request(PROMPTS[2], GREEDY)
    failures = []
    while router.has_unfinished():
        outputs.update({o.request_id: o for o in router.step()})
        failures += router.take_failures()
    assert [rid for rid, _ in failures] == [bad] and isinstance(failures[0][1], RequestFailed)
    assert str(failures[0][1]).count("reference") == 1 and "worker bug" not in str(failures[0][1])
    assert failures[0][1].__cause__.args == ("worker bug",)
    got = [outputs[r].outputs[0].token_ids for r in (*good, late)]
    assert got == [w.outputs[0].token_ids for w in want]
    assert router.reserved_tokens == 0 and not router.requests
