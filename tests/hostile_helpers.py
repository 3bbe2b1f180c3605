"""One engine behind the HTTP and gRPC APIs, for the hostile-client tests: a poisoned target worker,
a good request streaming in the background, and a raw POST."""

import json
import threading
import time

import httpx

from specray import LLM
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcLimits, GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
GOOD = [5, 9, 14, 5, 9, 14, 5]  # token ids: a prompt the n-gram draft speculates on
POISON = 96  # a prompt holding this token id makes the (wrapped) target worker raise
LIMIT = 64 * 1024  # body and message size limit of these servers
LEAKS = ("ray::", "pid=", "actor", "Traceback", "0xdead", "\x1b[")


class Engine:
    """One engine behind HTTP and gRPC, with a step that sleeps (so long requests stay running)
    and a target worker that fails any step holding a POISON prompt."""

    def __init__(self, tiny_target, max_num_seqs=32, max_waiting=256):
        self.llm = LLM(str(tiny_target), speculative_config=NGRAM, max_num_seqs=max_num_seqs)
        router, target = self.llm.router, self.llm.target
        step, worker_step = router.step, target.step
        self.delay = 0.003  # seconds a round at least
        router.step = lambda: (time.sleep(self.delay), step())[1]

        def poisoned(items):
            if any(item.spec is not None and POISON in item.new_token_ids for item in items):  # prefills
                raise RuntimeError("boom in actor 0xdeadbeef pid=4242 \x1b[31mTraceback\x1b[0m")
            return worker_step(items)
        target.step = poisoned
        self.router = AsyncRouter(router, max_waiting)
        self.http_server = OpenAIServer(self.router, self.llm.get_tokenizer(), "tiny", max_request_bytes=LIMIT)
        self.grpc_service = GenerationService(self.router, self.llm.get_tokenizer(), "tiny",
                                              metrics=self.http_server.metrics)

    def __enter__(self):
        self.http = BackgroundServer(self.http_server.app, header_timeout_s=1.0).__enter__()
        self.grpc = GrpcServerThread(self.grpc_service, limits=GrpcLimits(max_message_bytes=LIMIT)).__enter__()
        return self

    def __exit__(self, *exc):
        self.grpc.__exit__(*exc)
        self.http.__exit__(*exc)
        self.router.shutdown()

    def idle(self, seconds: float = 10) -> bool:
        r = self.router.router
        end = time.monotonic() + seconds
        while (r.has_unfinished() or r.reserved_tokens) and time.monotonic() < end:
            time.sleep(0.02)
        return not r.has_unfinished() and r.reserved_tokens == 0

    def metrics(self) -> dict[str, float]:
        lines = httpx.get(self.http.url + "/metrics").text.splitlines()
        return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if ln and not ln.startswith("#")}


class GoodStream:
    """A greedy SSE completion running in a thread while the bad requests arrive."""

    def __init__(self, url: str, max_tokens: int = 150):
        self.url, self.max_tokens, self.events = url, max_tokens, []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.started.wait(30)

    def _run(self):
        body = {"prompt": GOOD, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.started.set()

    def text(self) -> str:
        self.thread.join(120)
        assert self.events[-1] == "[DONE]", self.events[-3:]
        chunks = [json.loads(e) for e in self.events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        return "".join(c["choices"][0]["text"] for c in chunks)


def post(url: str, path: str, body) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
