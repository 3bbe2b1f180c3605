"""side_by_side: streams read concurrently, items in arrival order, the first error ends them all."""

import asyncio

import pytest

from specray.cluster.serve.merge import side_by_side


async def _ticks(name, n, delay, closed, fail_at=None):
    try:
        for k in range(n):
            await asyncio.sleep(delay)
            if k == fail_at:
                raise ValueError(f"{name} broke")
            yield f"{name}{k}"
    finally:
        closed.append(name)


def test_streams_interleave_as_their_items_come():
    async def run():
        closed = []
        got = [item async for item in side_by_side([_ticks("a", 3, 0.02, closed), _ticks("b", 3, 0.03, closed)])]
        return got, closed

    got, closed = asyncio.run(run())
    assert sorted(got) == [(0, "a0"), (0, "a1"), (0, "a2"), (1, "b0"), (1, "b1"), (1, "b2")]
    assert got.index((1, "b0")) < got.index((0, "a2")) and sorted(closed) == ["a", "b"]


def test_the_first_error_ends_every_stream():
    async def run():
        closed, got = [], []
        with pytest.raises(ValueError, match="b broke"):
            async for item in side_by_side([_ticks("a", 100, 0.01, closed), _ticks("b", 3, 0.015, closed, 1)]):
                got.append(item)
        await asyncio.sleep(0.05)  # the cancelled stream closes
        return got, closed

    got, closed = asyncio.run(run())
    assert (1, "b0") in got and sorted(closed) == ["a", "b"] and len(got) < 20


def test_a_reader_that_stops_early_closes_every_stream_and_each_stream_waits_for_its_reader():
    async def run():
        closed, produced = [], []

        async def counted(name):
            try:
                for k in range(100):
                    produced.append(name)
                    yield k
                    await asyncio.sleep(0)
            finally:
                closed.append(name)

        merged = side_by_side([counted("a"), counted("b")])
        got = [await merged.__anext__() for _ in range(3)]
        await asyncio.sleep(0.05)  # a stream does not run ahead of its reader
        ahead = len(produced) - len(got)
        await merged.aclose()
        return got, closed, ahead

    got, closed, ahead = asyncio.run(run())
    assert len(got) == 3 and sorted(closed) == ["a", "b"] and ahead <= 2
