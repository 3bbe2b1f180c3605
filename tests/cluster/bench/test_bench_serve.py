"""`specray bench serve` against live servers (HTTP and gRPC) and its load generator's timing."""

import json
import time

from specray.cluster.cli import main


def test_bench_serve_against_a_live_server(tiny_target, tmp_path):
    from specray import LLM
    from specray.cluster.router.async_router import AsyncRouter
    from specray.cluster.serve.http_server import BackgroundServer
    from specray.cluster.serve.openai_api import OpenAIServer

    llm = LLM(str(tiny_target), speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    router = AsyncRouter(llm.router)
    # each round's outputs get 20 ms to reach the client before the next round's: on a loaded box a
    # request's chunks otherwise coalesce into one (cumulative snapshots), leaving no inter-token gap
    flush = llm.router.after_submit
    llm.router.after_submit = lambda: (flush(), time.sleep(0.02))
    out = tmp_path / "serve"
    data = tmp_path / "words.jsonl"
    data.write_text("\n".join(json.dumps({"category": ["math", "qa"][i % 2], "prompt": f"w{i} w{i + 1} w{i + 2}"})
                              for i in range(10, 16)))
    with BackgroundServer(OpenAIServer(router, llm.get_tokenizer(), "tiny", api_key="k").app) as http:
        for extra in ([], ["--request-rate", "50", "--endpoint", "completions"]):
            code = main(["bench", "serve", "--url", http.url, "--api-key", "k", "--concurrency", "1,4",
                         "--num-requests", "6", "--max-tokens", "5", "--dataset", str(data), "--out", str(out),
                         "--temperature", "1.0", "--ignore-eos", *extra])
            assert code == 0
            report = json.loads((out / "serve.json").read_text())
            for level in report["levels"]:
                assert level["completed"] == 6 and level["errors"] == 0
                assert level["output_tokens"] == 6 * 5 and level["e2e_s"]["p50"] > 0  # ignore_eos: all run to 5
                assert level["ttft_s"]["p50"] <= level["e2e_s"]["p99"]
                # 1 + at most 3 tokens a round: every request streams 2+ chunks; chunks that arrive in one
                # read on a fast box have gaps that round to 0
                itl = level["itl_s"]
                assert 0 <= itl["p50"] <= itl["p99"] <= itl["max"] <= level["e2e_s"]["p99"] and itl["max"] > 0
                assert abs(level["throughput_tokens_per_s"] * level["seconds"] - 30) < 0.1  # seconds: 4 decimals
                cats = level["per_category"]
                assert set(cats) == {"math", "qa"} and sum(c["completed"] for c in cats.values()) == 6
                assert all(c["output_tokens"] == 3 * 5 and c["e2e_p50_s"] > 0 for c in cats.values())
            assert "| 4 | qa | 3 | 0 | 15 |" in (out / "serve.md").read_text()
            assert f"prompts: {data}" in (out / "serve.md").read_text()  # which prompts: installs differ
        wrong_key = main(["bench", "serve", "--url", http.url, "--model", "tiny", "--concurrency", "2",
                          "--num-requests", "3", "--out", str(out)])
        # every request refused (no key): the report is written, and the command fails saying why
        assert wrong_key == 1 and json.loads((out / "serve.json").read_text())["levels"][0]["errors"] == 3
    router.shutdown()
    assert (out / "serve.png").read_bytes()[:4] == b"\x89PNG" and (out / "serve.md").exists()


def test_bench_serve_over_grpc_lists_the_model_there(tiny_target, tmp_path):
    """--grpc asks the gRPC server for its model (ListModels), never an HTTP --url."""
    from specray import LLM
    from specray.cluster.router.async_router import AsyncRouter
    from specray.cluster.serve.grpc_server import GrpcServerThread
    from specray.cluster.serve.grpc_service import GenerationService

    llm = LLM(str(tiny_target))
    router = AsyncRouter(llm.router)
    out = tmp_path / "grpc"
    with GrpcServerThread(GenerationService(router, llm.get_tokenizer(), "tiny-grpc")) as server:
        code = main(["bench", "serve", "--grpc", server.target, "--url", "http://127.0.0.1:9", "--concurrency", "1",
                     "--num-requests", "2", "--max-tokens", "4", "--ignore-eos", "--out", str(out)])
    router.shutdown()
    report = json.loads((out / "serve.json").read_text())
    assert code == 0 and report["model"] == "tiny-grpc" and report["url"] is None
    assert report["levels"][0]["completed"] == 2 and (out / "serve.md").read_text().startswith("gRPC ")


def test_a_sample_times_the_gaps_between_its_chunks(monkeypatch):
    from specray.cluster.bench import load

    clock = iter([1.0, 1.5, 1.75, 3.0])
    monkeypatch.setattr(load.time, "perf_counter", lambda: next(clock))
    s = load.Sample(ok=True, start=0.5)
    for _ in range(4):
        s.chunk()
    assert s.first == 1.0 and s.gaps == [0.5, 0.25, 1.25] and s.last == 3.0


def test_open_loop_latency_counts_the_wait_for_a_slot():
    """Open loop: a request's clock starts on arrival, so waiting behind the concurrency cap is
    latency; closed loop: it starts when the request is sent."""
    import asyncio
    import time

    from specray.cluster.bench.load import Sample, drive

    async def send(body, start):
        s = Sample(ok=True, start=start or time.perf_counter())
        await asyncio.sleep(0.05)
        s.end = time.perf_counter()
        return s

    open_loop, _ = asyncio.run(drive(send, [{}] * 3, 1, 1000.0, seed=0))
    assert max(s.end - s.start for s in open_loop) >= 0.14  # the third waited behind two
    closed, _ = asyncio.run(drive(send, [{}] * 3, 1, None, seed=0))
    starts = sorted(s.start for s in closed)  # each clock starts as its request is sent, after the last ends
    assert all(b - a >= 0.045 for a, b in zip(starts, starts[1:]))


def test_a_run_with_failed_requests_fails_the_command(capsys):
    """48 of 60 failed (a replica killed mid-run) and it exited 0, its tokens/s over the survivors."""
    from specray.cluster.bench.serve import failed

    level = {"requests": 60, "completed": 12, "errors": 48, "error_examples": ["HTTP 503: restarting"]}
    assert failed([level]) == 1 and "48 of 60 requests failed, e.g. ['HTTP 503: restarting']" in capsys.readouterr().err
    assert failed([{**level, "completed": 0, "errors": 60}]) == 1 and "every request failed" in capsys.readouterr().err
    assert failed([{**level, "completed": 60, "errors": 0, "error_examples": []}]) == 0


def test_a_stream_cut_short_is_an_error_not_a_request_done():
    """A server or proxy that closed a stream after 3 of 64 tokens counted as a completed request."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import aiohttp

    from specray.cluster.bench.load import one_request

    class Streams(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for t in ("a", "b", "c"):
                self.wfile.write(b"data: " + json.dumps({"choices": [{"text": t}]}).encode() + b"\n\n")
            if self.path == "/whole":
                self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Streams)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def both():
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{server.server_port}"
            return [await one_request(session, f"{base}/{path}", {}, chat=False) for path in ("whole", "cut")]
    try:
        whole, cut = asyncio.run(both())
    finally:
        server.shutdown()
    assert whole.ok and whole.tokens == 3 and whole.error is None
    assert not cut.ok and cut.error == "the stream ended without [DONE]"
