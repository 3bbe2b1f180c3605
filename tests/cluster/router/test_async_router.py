"""AsyncRouter hands a round's outputs to the event loops once the next round's target step is sent
(so their streaming overlaps the target's compute), in order, and at once when no round follows; a
turn goes on with the next round while nothing else waits for its thread."""

import asyncio
import time

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

    llm.router.has_unfinished = broken  # outside the rounds' own error handling

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


def test_an_error_taking_one_request_fails_that_request_only(tiny_target):
    """`add_request` changes the router only once nothing can fail any more, so an unexpected error
    there (a bug, not a refusal) fails that request and the router goes on serving the others."""
    llm = LLM(str(tiny_target))
    router = AsyncRouter(llm.router)
    add = llm.router.add_request

    def picky(prompt_token_ids, *args, **kwargs):
        if prompt_token_ids[0] == 9:
            raise RuntimeError("a router bug")
        return add(prompt_token_ids, *args, **kwargs)

    llm.router.add_request = picky

    async def ask(prompt):
        return [o async for o in router.generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))]

    async def both():
        return await asyncio.gather(ask([5, 6, 7]), ask([9, 6, 7]), return_exceptions=True)

    try:
        good, bad = asyncio.run(both())
        assert isinstance(bad, RequestFailed) and router.alive, bad
        assert good[-1].finished and len(good[-1].outputs[0].token_ids) == 8
        assert not llm.router.has_unfinished() and not llm.router.requests
    finally:
        router.shutdown()


def test_shutdown_fails_what_it_leaves_unfinished_instead_of_a_silent_wait(tiny_target):
    llm = LLM(str(tiny_target))
    router = AsyncRouter(llm.router)

    async def ask():
        outs = []
        async for o in router.generate([5, 6, 7], SamplingParams(max_tokens=400, ignore_eos=True)):
            outs.append(o)
            if len(outs) == 2:
                await asyncio.get_running_loop().run_in_executor(None, router.shutdown)
        return outs

    async def bounded():
        return await asyncio.wait_for(ask(), timeout=30)

    with pytest.raises(RouterStopped, match="shut down before this request finished"):
        asyncio.run(bounded())


def test_a_request_after_shutdown_gets_an_error_not_a_silent_wait(tiny_target):
    router = AsyncRouter(LLM(str(tiny_target)).router)
    router.shutdown()

    async def ask():
        return [o async for o in router.generate([5, 6, 7], SamplingParams(max_tokens=2))]

    with pytest.raises(RouterStopped, match="shutting down"):
        asyncio.run(ask())
    from specray.cluster.serve.errors import UNAVAILABLE, status_of

    assert status_of(RouterStopped("x")) is UNAVAILABLE  # 503 / UNAVAILABLE: the client may retry



def _turns_and_tokens(llm, waiting, second_at: int | None = None):
    """Stream one request (and, with `second_at`, a second one added once the first has that many
    tokens) through an AsyncRouter; -> (turns that ran rounds, rounds, each request's token ids)."""
    router, turns, rounds = AsyncRouter(llm.router, waiting=waiting), [0], [0]
    turn, step, compute = router._turn, llm.router.step, llm.target.step

    def counted_turn():  # turns that ran a round
        before = rounds[0]
        turn()
        turns[0] += rounds[0] > before

    def counted_round():
        rounds[0] += 1
        return step()

    def slow(items):  # time for the event loop to add the second request between two rounds
        time.sleep(0.003)
        return compute(items)

    router._turn, llm.router.step, llm.target.step = counted_turn, counted_round, slow
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    async def one(prompt):
        return [o async for o in router.generate(prompt, params)][-1].outputs[0].token_ids

    async def both():
        first, later = asyncio.ensure_future(one([5, 6, 7])), None
        while second_at is not None and later is None:
            await asyncio.sleep(0.0005)
            assert not first.done(), "the first request ended before the second could join it"
            if max((len(s.output_token_ids) for s in list(llm.router.running)), default=0) >= second_at:
                later = asyncio.ensure_future(one([9, 8]))
        return [await first] + ([await later] if later else [])

    try:
        tokens = asyncio.run(both())
    finally:
        router.shutdown()  # returns once the last turn ended (it counts itself after its last output)
        llm.router.step, llm.target.step = step, compute
    return turns[0], rounds[0], tokens


def test_a_turn_runs_rounds_until_something_else_waits_for_its_thread(tiny_target):
    llm = LLM(str(tiny_target))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate([[5, 6, 7], [9, 8]], params)]
    turns, rounds, tokens = _turns_and_tokens(llm, waiting=None)  # nothing else uses the turns' thread
    assert tokens == want[:1] and turns == 1 and rounds >= 2
    turns, rounds, tokens = _turns_and_tokens(llm, waiting=lambda: True)
    assert tokens == want[:1] and turns == rounds >= 2  # a turn a round
    # a request added while a turn runs joins at that turn's next round
    turns, rounds, tokens = _turns_and_tokens(llm, waiting=None, second_at=3)
    assert tokens == want and turns == 1


def test_a_call_for_the_compute_thread_runs_between_two_rounds_of_a_turn(tiny_target):
    """As in the replica: rounds on the compute thread, and a worker call (a health ping, a stats
    read) from another thread waits for one round at most, not for the running requests to end."""
    from specray.cluster.pools import compute_thread

    llm = LLM(str(tiny_target))
    rounds, step, compute = [0], llm.router.step, llm.target.step

    def counted_round():
        rounds[0] += 1
        return step()

    def slow(items):
        time.sleep(0.01)
        return compute(items)

    llm.router.step, llm.target.step = counted_round, slow
    router = AsyncRouter(llm.router, post=compute_thread.post, waiting=compute_thread.waiting)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)

    async def last():
        return [o async for o in router.generate([5, 6, 7], params)][-1]

    async def stream_and_call():
        run = asyncio.ensure_future(last())
        while rounds[0] < 3:
            await asyncio.sleep(0.002)
        seen = await asyncio.to_thread(compute_thread.run, lambda: rounds[0])  # from another thread
        return seen, rounds[0], await run

    try:
        seen, after, out = asyncio.run(stream_and_call())
    finally:
        router.shutdown()
        llm.router.step, llm.target.step = step, compute
    assert 3 <= seen <= after and seen <= 6  # served after the round under way (not after the 30th)
    assert out.finished and len(out.outputs[0].token_ids) == 30



def test_a_closed_callers_loop_takes_nothing_and_the_others_still_get_theirs(tiny_target):
    """A loop closed between the check and the call (a server stopping while the router serves)
    raised out of the delivery: every running request failed, and the other loops' outputs were lost."""
    class Closed:
        def call_soon_threadsafe(self, *args):
            raise RuntimeError("Event loop is closed")

    class Open:
        def __init__(self):
            self.calls = []

        def call_soon_threadsafe(self, fn, puts):
            self.calls.append(puts)

    router = AsyncRouter(LLM(str(tiny_target)).router)
    try:
        open_loop, queue = Open(), asyncio.Queue()
        router._streams.update({"a": (Closed(), asyncio.Queue()), "b": (open_loop, queue)})
        router._deliver_all([("a", "for a"), ("b", "for b")])
        assert open_loop.calls == [[(queue, "for b")]]
    finally:
        router.shutdown()


def test_no_request_is_admitted_once_a_turn_broke(tiny_target):
    """A broken router queues no turn (it would run on a router left halfway through a step), so
    admission refuses under the lock the failure delivery takes: no request waits on turns that stopped."""
    router = AsyncRouter(LLM(str(tiny_target)).router)
    router._broken = RuntimeError("a router bug")
    router._queue_turn()
    assert not router._turn_queued

    async def ask():
        return [o async for o in router.generate([5, 6, 7], SamplingParams(max_tokens=2))]

    try:
        with pytest.raises(RouterStopped, match="internal error"):
            asyncio.run(ask())
    finally:
        router.shutdown()
