"""Several async streams read side by side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def side_by_side(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(stream index, item) of every stream as its items come, the streams read concurrently, each
    with one item in flight (a slow reader leaves a router stream to coalesce its outputs). The
    first error ends them all (each is cancelled, which closes it) and is raised here."""
    queue: asyncio.Queue = asyncio.Queue()  # holds at most one item a stream, and the ends
    taken = [asyncio.Event() for _ in streams]
    end = object()

    async def pump(i, stream):
        try:
            async for item in stream:
                queue.put_nowait((i, item))
                await taken[i].wait()
                taken[i].clear()
            queue.put_nowait((i, end))
        except Exception as e:  # the reader raises it
            queue.put_nowait((i, e))
        except BaseException as e:  # cancelled: the reader stops too
            queue.put_nowait((i, e))
            raise

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is end:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
                taken[i].set()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # the streams closed (their runs aborted)
