"""What a streaming HTTP client costs the node it shares with the server: CPU milliseconds a
streamed chunk, httpx against aiohttp (the load generator of `specray bench`), against a running
server, the two clients alternating request by request batch.

    specray serve --kernels fast &
    python benchmarks/client_cost.py --url http://127.0.0.1:8000 --requests 8 --max-tokens 64 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def bodies(model: str, n: int, max_tokens: int) -> list[dict]:
    return [{"model": model, "messages": [{"role": "user", "content": f"Tell me a story about item {i}."}],
             "max_tokens": max_tokens, "stream": True, "temperature": 0, "ignore_eos": True} for i in range(n)]


async def via_httpx(url: str, requests: list[dict]) -> int:
    import httpx

    events = 0
    async with httpx.AsyncClient(timeout=600) as client:
        for body in requests:
            async with client.stream("POST", url, json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        json.loads(line[6:])
                        events += 1
    return events


async def via_aiohttp(url: str, requests: list[dict]) -> int:
    import aiohttp

    from specray.cluster.bench.load import sse_events

    events = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for body in requests:
            async with session.post(url, json=body) as resp:
                async for event in sse_events(resp):
                    events += event is not None  # None: the closing [DONE]
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's root")
    parser.add_argument("--model", default="smollm2-135m", help="model name to send")
    parser.add_argument("--requests", type=int, default=8, help="sequential requests a client a repeat")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens a request (ignore_eos)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of both clients")
    args = parser.parse_args()
    url = args.url.rstrip("/") + "/v1/chat/completions"
    for _ in range(args.repeats):
        for name, client in (("httpx", via_httpx), ("aiohttp", via_aiohttp)):
            cpu, wall = time.process_time(), time.perf_counter()
            events = asyncio.run(client(url, bodies(args.model, args.requests, args.max_tokens)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(f"{name:8s} {events} chunks, {cpu * 1e3 / events:.3f} ms CPU a chunk, "
                  f"{args.requests * args.max_tokens / wall:.1f} tokens/s")


if __name__ == "__main__":
    main()
