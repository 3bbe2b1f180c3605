"""The load generator of `specray bench serve` and `bench cluster`: requests streamed over HTTP
(any OpenAI-compatible server) or specray's gRPC API, closed loop at a concurrency or open loop at
a request rate, each timed as a Sample (arrival or send, first token, the gaps between chunks, end)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from specray.cluster.bench.listing import api_root


@dataclass
class Sample:
    ok: bool
    start: float  # open loop: the arrival; closed loop: when sent
    first: float | None = None
    end: float = 0.0
    tokens: int = 0
    error: str | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive streamed chunks
    last: float | None = None  # when the latest chunk arrived

    def chunk(self) -> None:
        """A chunk with tokens arrived: the first one's time, or the gap since the last."""
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now


async def one_request(session, url: str, body: dict, chat: bool, start: float | None = None) -> Sample:
    s = Sample(ok=False, start=start or time.perf_counter())
    chunks = 0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                s.error = f"HTTP {resp.status}"
                await resp.read()
                return s
            done = False
            async for event in sse_events(resp):
                if event is None:  # [DONE]
                    done = True
                    continue
                if "error" in event:
                    s.error = event["error"].get("message", "error in stream")
                    return s
                if event.get("usage"):
                    s.tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    text = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if text:
                        chunks += 1
                        s.chunk()
            if not done:  # a stream cut short (a proxy, a crashed server): its tokens are not a whole answer
                s.error = "the stream ended without [DONE]"
                return s
        s.ok = True
    except Exception as e:  # a refused connection or a timeout counts as an error, not a crash
        s.error = f"{type(e).__name__}: {e}"
    finally:
        s.end = time.perf_counter()
        s.tokens = s.tokens or chunks  # servers without stream usage: one chunk ~ one token
    return s


async def sse_events(resp):
    """The JSON of each SSE data line of a streamed response, then None for the closing [DONE]."""
    pending = b""
    async for data in resp.content.iter_any():
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line == b"data: [DONE]":
                yield None
            elif line.startswith(b"data: "):
                yield json.loads(line[6:])


async def drive(send, bodies: list[dict], concurrency: int, rate: float | None, seed: int, progress=None):
    """Issue `send(body, start)` for every body, at most `concurrency` at once: all at the start
    (closed loop) or with exponential gaps (open loop, `rate` arrivals a second). -> (samples in
    the bodies' order, seconds)."""
    gate, rng = asyncio.Semaphore(concurrency), random.Random(seed)

    async def guarded(body):
        arrival = time.perf_counter()
        async with gate:
            sample = await send(body, arrival if rate else None)
        if progress is not None:
            progress.update(1)
        return sample

    start, tasks = time.perf_counter(), []
    for body in bodies:
        tasks.append(asyncio.create_task(guarded(body)))
        if rate:  # open loop: exponential gaps between arrivals
            await asyncio.sleep(rng.expovariate(rate))
    samples = await asyncio.gather(*tasks)
    return samples, time.perf_counter() - start


async def run_level(base: str, headers: dict, bodies: list[dict], chat: bool, concurrency: int,
                    rate: float | None, seed: int, progress=None, keepalive: bool = True) -> tuple[list[Sample], float]:
    """One level; `keepalive=False` opens a connection a request (llama-server's HTTP library closes
    a kept-alive connection after a few requests, which a reusing client sees as a failed request).
    aiohttp, not httpx: on a small node the load generator shares the server's cores, and httpx's
    streaming cost about 2.5x the CPU a chunk (docs/performance.md)."""
    import aiohttp

    url = api_root(base) + ("/v1/chat/completions" if chat else "/v1/completions")
    connector = aiohttp.TCPConnector(limit=0, force_close=not keepalive)
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=600.0),
                                     connector=connector) as session:
        return await drive(lambda body, start: one_request(session, url, _wire(body), chat, start), bodies,
                           concurrency, rate, seed, progress)


def _wire(body: dict) -> dict:
    """The HTTP body: without the bookkeeping keys (category)."""
    return {k: v for k, v in body.items() if k != "category"}


async def one_grpc_request(client, body: dict, chat: bool, start: float | None = None) -> Sample:
    """The same request through specray's gRPC API (`specray.client.AsyncClient.stream`)."""
    from specray.client import Sampling, SpecrayError

    s = Sample(ok=False, start=start or time.perf_counter())
    sampling = Sampling(max_tokens=body["max_tokens"], temperature=body["temperature"], seed=body.get("seed"),
                        ignore_eos=body.get("ignore_eos", False))
    prompt = None if chat else body["prompt"]
    try:
        stream = client.stream(prompt, messages=body.get("messages") if chat else None, sampling=sampling,
                               model=body.get("model"))
        async for delta in stream:
            if delta.token_ids:
                s.chunk()
                s.tokens += len(delta.token_ids)
        s.end, s.ok = time.perf_counter(), True
    except SpecrayError as e:
        s.error = f"gRPC {e.code.name}: {e.details}"
    return s


async def run_level_grpc(target: str, api_key: str | None, bodies: list[dict], chat: bool, concurrency: int,
                         rate: float | None, seed: int, progress=None) -> tuple[list[Sample], float]:
    from specray.client import AsyncClient

    async with AsyncClient(target, api_key=api_key, timeout=600) as client:
        return await drive(lambda body, start: one_grpc_request(client, body, chat, start), bodies,
                           concurrency, rate, seed, progress)
