"""The Ray Serve application on a multi-node Ray cluster on one machine: workers on the right
nodes, served greedy outputs equal to the in-process engine's for concurrent requests (HTTP with
the official `openai` client, and gRPC with specray.client through the replica's gRPC server),
bad input answered with 400, metrics that move, a client that hangs up freeing its sequence, a
draft worker killed mid-generation costing nothing, and a target worker killed mid-generation
failing its requests retryably while the service recovers (bad requests beside both failing alone)."""

import json
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/conftest.py)

from specray import LLM, SamplingParams  # noqa: E402
from specray.cluster.config.serve import ServeConfig  # noqa: E402
from specray.cluster.serve.http_server import free_port  # noqa: E402

PROMPTS = [[1, 3 + i, 17, 40 + 2 * i, 9] * (1 + i % 3) for i in range(6)]
MESSAGES = [{"role": "user", "content": "w10 w11 w12 w10 w11"}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(ray_cluster, tiny_target, tiny_draft):
    from ray import serve

    from specray.cluster.serve.run import run_serve

    cfg = ServeConfig.from_dict({
        "model": str(tiny_target), "served_model_name": "tiny",
        "speculative_config": {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 3},
        "router": {"kv_cache_tokens": 8192, "max_num_seqs": 8, "pipelined": True},
        "pools": {"target": {"threads": 1}, "draft": {"threads": 1}},
        "http": {"server": "proxy", "host": "127.0.0.1", "port": free_port()}, "grpc": {"port": free_port()}})
    started = run_serve(cfg, proxy_location="HeadOnly")
    yield cfg, started
    serve.delete("specray")


@pytest.fixture(scope="module")
def handle(served):
    from ray import serve

    return serve.get_app_handle("specray")


@pytest.fixture(scope="module")
def offline(tiny_target, tiny_draft):
    return LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})


@pytest.fixture(scope="module")
def reference(offline):
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0] for o in offline.generate([{"prompt_token_ids": p} for p in PROMPTS], sp)]


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{served[0].http.port}/v1", api_key="none", max_retries=0)


def complete_all(client, prompts, results, errors):
    def one(i, p):
        try:
            results[i] = client.completions.create(model="tiny", prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                                   extra_body={"ignore_eos": True})
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors[i] = e

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    return threads


def test_workers_land_on_their_nodes(ray_cluster, handle):
    placement = handle.placement.remote().result()
    assert [node for _, node in placement["target"]] == [ray_cluster["target"].node_id]
    assert [node for _, node in placement["draft"]] == [ray_cluster["draft"].node_id]


def test_concurrent_served_greedy_equals_in_process(client, reference, handle):
    from specray.cluster.router.round_stats import breakdown

    before = handle.round_stats.remote().result()
    results, errors = {}, {}
    for t in complete_all(client, PROMPTS, results, errors):
        t.join()
    assert not errors
    m = breakdown(before, handle.round_stats.remote().result())
    # reported by the target worker itself (the router times only its wait after submitting, so with a
    # same-node channel's short hop the worker's compute may exceed it)
    assert m["rounds"] > 0 and 0 < m["target_compute"] != m["target_wait"]
    assert m["draft_compute"] > 0 and m["draft_compute"] != m["draft_wait"]  # reported by the draft actor itself
    assert [results[i].choices[0].text for i in range(len(PROMPTS))] == [r.text for r in reference]
    accepted = [results[i].usage.model_extra["speculative"]["num_accepted_tokens"] for i in range(len(PROMPTS))]
    assert sum(accepted) > 0 and len(set(accepted)) > 1  # ragged acceptance


def test_chat_streaming_and_not(client, offline):
    want = offline.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=12)
    assert resp.choices[0].message.content == want
    chunks = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=12,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want


def test_completion_streaming(client, reference):
    chunks = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reference[1].text


def test_bad_input_is_400_and_serving_goes_on(client, served, reference):
    for bad in ({"temperature": -1}, {"max_tokens": 0}, {"top_p": 2.0}):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny", prompt=PROMPTS[0], **{"max_tokens": 4, **bad})
        assert err.value.status_code == 400 and err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=PROMPTS[0], max_tokens=4)
    ok = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert ok.choices[0].text == reference[0].text
    metrics = httpx.get(f"http://127.0.0.1:{served[0].http.port}/metrics").text
    assert 'specray_request_failure_total{status="400"} 3.0' in metrics
    drafted = [line for line in metrics.splitlines() if line.startswith("specray_spec_decode_num_draft_tokens_total")]
    assert drafted and float(drafted[0].split()[-1]) > 0


def test_grpc_through_the_replica_server(served, reference):
    from specray.client import Client, Sampling

    cfg, started = served
    assert started["grpc"]
    with Client(f"127.0.0.1:{cfg.grpc.port}", timeout=60) as grpc_client:
        sampling = Sampling(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        assert grpc_client.generate(PROMPTS[2], sampling=sampling).choices[0].token_ids == reference[2].token_ids
        streamed = [t for d in grpc_client.stream(PROMPTS[3], sampling=sampling) for t in d.token_ids]
        assert streamed == reference[3].token_ids
        assert [m.id for m in grpc_client.models()] == ["tiny"]


def send_bad_requests(port: int, grpc_port: int) -> list:
    """Bad requests beside the good ones: each must fail alone, with a client error."""
    from specray.client import Client, InvalidArgumentError

    url = f"http://127.0.0.1:{port}/v1/completions"
    answers = [httpx.post(url, json={"prompt": PROMPTS[0], "logprobs": 10**6}, timeout=60),
               httpx.post(url, content=json.dumps({"prompt": "a\ud800b", "max_tokens": 4}), timeout=60,
                          headers={"Content-Type": "application/json"}),
               httpx.post(url, json={"prompt": PROMPTS[0], "max_tokens": True}, timeout=60)]
    assert [a.status_code for a in answers] == [400, 400, 400]
    with Client(f"127.0.0.1:{grpc_port}", timeout=60) as c:
        with pytest.raises(InvalidArgumentError, match="temperature"):  # the server's refusal, not the SDK's
            c.generate(PROMPTS[0], max_tokens=4, temperature=-1.0)
    return answers


def test_killing_the_draft_worker_loses_nothing(client, served, handle, reference):
    placement = handle.placement.remote().result()
    draft = ray.get_actor(placement["draft"][0][0], namespace=placement["namespace"])
    results, errors = {}, {}
    threads = complete_all(client, PROMPTS, results, errors)
    wait_running(served[0].http.port)
    ray.kill(draft, no_restart=False)  # Ray restarts it; the router decodes target-only meanwhile
    send_bad_requests(served[0].http.port, served[0].grpc.port)
    for t in threads:
        t.join()
    assert not errors
    assert [results[i].choices[0].text for i in range(len(PROMPTS))] == [r.text for r in reference]


def test_a_client_that_hangs_up_frees_its_sequence_through_the_proxy(served):
    """Ray Serve's proxy cancels the replica's handler when an HTTP client leaves, streaming or not."""
    port = served[0].http.port
    # eight choices of 400 tokens: seconds of rounds even on a fast box, where one choice finished in 0.5 s
    body = {"prompt": PROMPTS[1] * 4, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "n": 8}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=0.5)
    assert wait_running(port, at_least=0, exactly=True, timeout_s=10) is None


def wait_running(port, at_least=1, timeout_s=30.0, exactly=False):
    """Block until the router reports `at_least` running sequences (so a kill lands mid-generation),
    or, `exactly`, that many."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
            if line.startswith("specray_num_requests_running "):
                running = float(line.split()[-1])
                if running == at_least if exactly else running >= at_least:
                    return
        time.sleep(0.02)
    raise AssertionError(f"running sequences never reached {at_least}")


def test_target_failure_is_retryable_and_the_service_recovers(client, served, handle, reference):
    placement = handle.placement.remote().result()
    target = ray.get_actor(placement["target"][0][0], namespace=placement["namespace"])
    long = [p * 3 for p in PROMPTS]
    results, errors = {}, {}
    threads = []
    for i, p in enumerate(long):
        def one(i=i, p=p):
            try:
                results[i] = client.completions.create(model="tiny", prompt=p, max_tokens=400, temperature=0,
                                                       extra_body={"ignore_eos": True})
            except Exception as e:  # noqa: BLE001
                errors[i] = e
        threads.append(threading.Thread(target=one))
        threads[-1].start()
    wait_running(served[0].http.port)
    ray.kill(target, no_restart=True)
    bad = send_bad_requests(served[0].http.port, served[0].grpc.port)
    for t in threads:
        t.join()
    assert errors, "in-flight requests must fail when their target worker dies"
    for e in errors.values():
        assert isinstance(e, openai.APIStatusError) and e.status_code == 503 and "retry" in e.message
        assert e.response.headers["Retry-After"] and not any(w in e.message for w in ("ray::", "pid=", "Actor"))
    assert all(b.json()["error"]["type"] == "invalid_request_error" for b in bad)
    deadline = time.monotonic() + 120
    while True:  # the pool has started a fresh worker; requests succeed again, same outputs
        try:
            ok = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"ignore_eos": True})
            break
        except openai.APIStatusError:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    assert ok.choices[0].text == reference[0].text


def test_bench_serve_drives_grpc_and_http_alike(served):
    """`specray bench serve` over gRPC and over HTTP: same prompts, same token counts, no errors."""
    import asyncio

    from specray.cluster.bench.load import run_level, run_level_grpc

    cfg = served[0]
    bodies = [{"model": "tiny", "prompt": "w5 w9 w12 w5 w9", "max_tokens": 8, "temperature": 0.0, "stream": True,
               "stream_options": {"include_usage": True}} for _ in range(3)]
    via_grpc, _ = asyncio.run(run_level_grpc(f"127.0.0.1:{cfg.grpc.port}", None, bodies, False, 2, None, 0))
    via_http, _ = asyncio.run(run_level(f"http://127.0.0.1:{cfg.http.port}", {}, bodies, False, 2, None, 0))
    assert all(s.ok for s in via_grpc + via_http)
    assert [s.tokens for s in via_grpc] == [s.tokens for s in via_http] and via_grpc[0].tokens > 0
