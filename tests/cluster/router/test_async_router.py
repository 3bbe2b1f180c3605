"""AsyncRouter hands a round's outputs to the event loops once the next round's target step is sent
(so their streaming overlaps the target's compute), in order, and at once when no round follows."""

import asyncio

import pytest

from specray import LLM, SamplingParams
from specray.cluster.outputs import RequestOutput
from specray.cluster.router.failures import RequestFailed
from specray.cluster.router.async_router import AsyncRouter, RouterStopped


def test_outputs_go_out_after_the_next_target_step_and_the_last_at_once(tiny_target):
    llm = LLM(str(tiny_target))  # plain decoding: round r brings token r
    want = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    pool, sent = llm.router.target, [0]
    submit, compute = pool.submit_step, llm.target.step
    handed_at_compute = []  # outputs handed to the event loop when each step began computing

    def computed(items):
        handed_at_compute.append(len(handed))
        return compute(items)

    llm.target.step = computed

    def counted(items):
        sent[0] += 1
        return submit(items)

    pool.submit_step = counted
    router = AsyncRouter(llm.router)
    handed = []  # (tokens in the output, target steps sent by then)
    deliver = router._deliver_all

    def recorded(items):
        handed.extend((len(o.outputs[0].token_ids), sent[0]) for _, o in items if isinstance(o, RequestOutput))
        deliver(items)

    router._deliver_all = recorded

    async def stream():
        return [o async for o in router.generate([5, 6, 7], SamplingParams(max_tokens=6, temperature=0,
                                                                            ignore_eos=True))]

    try:
        outs = asyncio.run(stream())
    finally:
        router.shutdown()
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == want.outputs[0].token_ids
    assert [tokens for tokens, _ in handed] == [1, 2, 3, 4, 5, 6]  # every round's, in order
    assert all(steps == tokens + 1 for tokens, steps in handed[:-1])  # held until the next step was sent
    assert handed[-1] == (6, 6)  # the last one at once: no round follows
    # an in-process step computes after the hand-off, so the outputs stream while it computes
    assert handed_at_compute == [0, 1, 2, 3, 4, 5]


def test_a_turn_that_breaks_fails_its_requests_and_marks_the_router_dead(tiny_target):
    llm = LLM(str(tiny_target))
    router = AsyncRouter(llm.router)

    def broken(*args, **kwargs):
        raise RuntimeError("a router bug")

    llm.router.add_request = broken  # outside the rounds' own error handling

    async def ask():
        return [o async for o in router.generate([5, 6, 7], SamplingParams(max_tokens=2))]

    try:
        with pytest.raises(RequestFailed):
            asyncio.run(ask())
        assert not router.alive  # the replica's health check fails, and Serve restarts it
        with pytest.raises(RouterStopped, match="router stopped"):
            asyncio.run(ask())
    finally:
        router.shutdown()


def test_a_request_after_shutdown_gets_an_error_not_a_silent_wait(tiny_target):
    router = AsyncRouter(LLM(str(tiny_target)).router)
    router.shutdown()

    async def ask():
        return [o async for o in router.generate([5, 6, 7], SamplingParams(max_tokens=2))]

    with pytest.raises(RouterStopped, match="shutting down"):
        asyncio.run(ask())
    from specray.cluster.serve.errors import UNAVAILABLE, status_of

    assert status_of(RouterStopped("x")) is UNAVAILABLE  # 503 / UNAVAILABLE: the client may retry
