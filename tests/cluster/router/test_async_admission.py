"""AsyncRouter's admission: max_waiting bounds the sequences that wait beyond the running batch's
free places, whatever the timing of a burst."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from specray import LLM, SamplingParams
from specray.cluster.outputs import RequestOutput
from specray.cluster.router.async_router import AsyncRouter, QueueFullError


def test_a_burst_into_an_idle_batch_takes_its_free_places_before_it_queues(tiny_target):
    """max_waiting bounds the sequences that wait for a place: three requests sent at once to an idle
    server with two places and a queue of one were refused one in three tries (a 429 beside free
    places); a fourth is refused."""
    llm = LLM(str(tiny_target), max_num_seqs=2)
    gate, rounds = threading.Event(), ThreadPoolExecutor(1)
    # no round runs until all four were admitted or refused: the places stay free, whatever the timing
    router = AsyncRouter(llm.router, max_waiting=1, post=lambda fn: rounds.submit(lambda: (gate.wait(), fn())[1]))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)

    async def run():
        return [o async for o in router.generate([5, 6, 7], params)][-1]

    async def burst():
        tasks = [asyncio.ensure_future(run()) for _ in range(4)]
        await asyncio.sleep(0.1)  # each task is admitted (or refused) at its first step
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        outs = asyncio.run(burst())
    finally:
        gate.set()
        router.shutdown()
        rounds.shutdown()
    assert [type(o) for o in outs] == [RequestOutput] * 3 + [QueueFullError]
    assert all(len(o.outputs[0].token_ids) == 40 for o in outs[:3])
