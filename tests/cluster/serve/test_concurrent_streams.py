"""Served outputs equal the in-process API's token for token at concurrency 1-16, over HTTP and
gRPC, streaming and not, with the served prompts prefilled in chunks; a consumer that falls behind gets coalesced snapshots (fewer chunks) with
the same text, order and finish reasons."""

import asyncio
import json

import httpx
import pytest

from specray import LLM, SamplingParams
from specray.client import AsyncClient
from specray.cluster.router.async_router import AsyncRouter, Snapshots
from specray.cluster.outputs import RequestOutput
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer

SPEC = {"num_speculative_tokens": 3}
PROMPTS = [" ".join(f"w{(7 * i + j) % 40}" for j in range(3 + i % 4)) for i in range(16)]


def params(i: int) -> dict:
    """Lengths and finish reasons vary: every third request stops at a string."""
    return {"temperature": 0, "max_tokens": 6 + i % 7, "ignore_eos": True, **({"stop": ["w3"]} if i % 3 == 0 else {})}


@pytest.fixture(scope="module")
def want(tiny_target):
    llm = LLM(str(tiny_target))  # no speculation: the reference
    outs = llm.generate(PROMPTS, [SamplingParams(**params(i)) for i in range(len(PROMPTS))])
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


@pytest.fixture(scope="module")
def served(tiny_target, tiny_draft):
    # a prompt-token budget below most prompts' lengths: served prompts prefill in chunks
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), **SPEC}, max_num_seqs=16,
              max_prefill_tokens=5)
    router = AsyncRouter(llm.router)
    tok = llm.get_tokenizer()
    service = GenerationService(router, tok, "tiny", speculative_method="draft_model")
    with BackgroundServer(OpenAIServer(router, tok, "tiny").app) as http, GrpcServerThread(service) as grpc_:
        yield http.url, grpc_.target, router
    router.shutdown()


async def http_one(client, url, i, stream):
    body = {"model": "tiny", "prompt": PROMPTS[i], "stream": stream, **params(i)}
    if not stream:
        choice = (await client.post(url, json=body)).json()["choices"][0]
        return choice["text"], choice["finish_reason"]
    text, reason = "", None
    async with client.stream("POST", url, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                assert reason is None, "a chunk after the finish"
                text, reason = text + c["text"], c["finish_reason"]
    return text, reason


async def all_http(url, concurrency, stream):
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:
        async def one(i):
            async with limit:
                return await http_one(client, url + "/v1/completions", i, stream)
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))


async def all_grpc(target, concurrency, stream):
    limit = asyncio.Semaphore(concurrency)
    async with AsyncClient(target, timeout=60) as c:
        async def one(i):
            async with limit:
                if stream:
                    done = await c.stream(PROMPTS[i], **params(i)).collect()
                else:
                    done = await c.generate(PROMPTS[i], **params(i))
                return done.choices[0].text, done.choices[0].finish_reason
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))


@pytest.mark.parametrize("concurrency", [1, 4, 16])
@pytest.mark.parametrize("stream", [True, False])
def test_http_equals_in_process(served, want, concurrency, stream):
    assert asyncio.run(all_http(served[0], concurrency, stream)) == want


@pytest.mark.parametrize("concurrency", [1, 16])
@pytest.mark.parametrize("stream", [True, False])
def test_grpc_equals_in_process(served, want, concurrency, stream):
    assert asyncio.run(all_grpc(served[1], concurrency, stream)) == want


def test_slow_consumers_get_coalesced_snapshots_with_the_same_text(served, want):
    router = served[2]

    async def one(i):
        chunks, text, reason = 0, "", None
        async for out in router.generate(router.router.tokenizer.encode(PROMPTS[i]), SamplingParams(**params(i))):
            c = out.outputs[0]
            assert c.text.startswith(text), "snapshots stay cumulative and in order"
            chunks, text, reason = chunks + 1, c.text, c.finish_reason
            await asyncio.sleep(0.05)  # the consumer falls behind the rounds
        return (text, reason), chunks, out.metrics.num_rounds

    async def main():
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

    results = asyncio.run(main())
    assert [r[0] for r in results] == want
    assert any(chunks < rounds for _, chunks, rounds in results), "no consumer fell behind: the test needs one"


def test_a_stream_keeps_the_newest_snapshot_and_never_skips_a_failure_or_the_final_output():
    """An unfinished output queued is replaced by the next (a consumer that stopped reading holds one
    output, not one a round); a failure and the final output are never replaced."""
    def snap(n, finished=False):
        return RequestOutput("r", None, [n], [], finished)

    async def drain(items):
        q = Snapshots()
        for item in items:
            q.put_nowait(item)
        return [q.get_nowait() for _ in range(q.qsize())]

    def shown(items):
        return [i if isinstance(i, Exception) else (i.prompt_token_ids[0], i.finished) for i in items]

    error = ValueError("broke")
    assert shown(asyncio.run(drain([snap(n) for n in range(1, 200)]))) == [(199, False)]
    assert shown(asyncio.run(drain([snap(2), snap(3), snap(4, finished=True), snap(5)]))) == [(4, True), (5, False)]
    assert shown(asyncio.run(drain([snap(2), error, snap(3)]))) == [(2, False), error, (3, False)]
