"""Several async streams read side by side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def side_by_side(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(stream index, item) of every stream as its items come, the streams read concurrently. The
    first error ends them all (each is cancelled, which closes it) and is raised here."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(i, stream):
        try:
            async for item in stream:
                queue.put_nowait((i, item))
            queue.put_nowait((i, end))
        except Exception as e:  # raised by the reader; cancellation passes through
            queue.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is end:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
