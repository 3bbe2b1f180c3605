"""The gRPC API over a real engine (tiny model, n-gram speculation), driven by the client SDK:
greedy outputs equal the offline API's token for token, sync and asyncio, text/ids/chat."""

import asyncio
import shutil
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specray import LLM, SamplingParams
from specray.client import AsyncClient, Client, InvalidArgumentError, Sampling
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService

KEY = "sk-grpc"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
MESSAGES = [{"role": "user", "content": "w10 w11 w12"}]
PROMPT = "w20 w21 w22 w20 w21"
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def offline(tiny_target):
    return LLM(str(tiny_target))  # no speculation: the reference


@pytest.fixture(scope="module")
def served(tiny_target):
    llm = LLM(str(tiny_target), speculative_config=NGRAM)
    router = AsyncRouter(llm.router)
    service = GenerationService(router, llm.get_tokenizer(), "tiny", api_key=KEY, speculative_method="ngram")
    with GrpcServerThread(service) as server:
        yield server, service
    router.shutdown()


@pytest.fixture()
def client(served):
    with Client(served[0].target, api_key=KEY, timeout=30) as c:
        yield c


def greedy(**kw):
    return dict(temperature=0, max_tokens=12, ignore_eos=True, **kw)


def test_unary_and_stream_match_offline_greedy(client, offline):
    want = offline.generate(PROMPT, GREEDY)[0].outputs[0]
    got = client.generate(PROMPT, **greedy())
    assert got.choices[0].token_ids == want.token_ids and got.text == want.text
    assert got.choices[0].finish_reason == "length" and got.usage.completion_tokens == 12
    assert got.speculative.num_draft_tokens > 0 and got.speculative.num_rounds > 0
    stream = client.stream(PROMPT, **greedy())
    deltas = list(stream)
    assert [t for d in deltas for t in d.token_ids] == want.token_ids
    assert "".join(d.text for d in deltas) == want.text
    assert deltas[-1].finish_reason == "length" and stream.summary.finish_reasons == ["length"]
    assert stream.summary.usage == got.usage and stream.summary.request_id == stream.request_id


def test_token_id_prompt_and_speculation_off_are_lossless(client, offline):
    ids = offline.get_tokenizer()(PROMPT).input_ids
    want = offline.generate({"prompt_token_ids": ids}, GREEDY)[0].outputs[0].token_ids
    spec = client.generate(ids, **greedy())
    plain = client.generate(ids, **greedy(num_speculative_tokens=0))
    assert spec.choices[0].token_ids == plain.choices[0].token_ids == want
    assert plain.speculative.num_draft_tokens == 0 and spec.speculative.num_draft_tokens > 0


def test_chat_sync_and_stream(client, offline):
    want = offline.chat(MESSAGES, GREEDY)[0].outputs[0]
    assert client.chat(MESSAGES, sampling=Sampling(**greedy())).text == want.text
    assert client.stream(messages=MESSAGES, **greedy()).collect().choices[0].token_ids == want.token_ids


def test_chat_continues_the_final_message(client, offline):
    """A prefilled reply: the output is what follows the last message's text, as the offline API's."""
    prefill = [*MESSAGES, {"role": "assistant", "content": "w30 w31"}]
    want = offline.chat(prefill, GREEDY, add_generation_prompt=False, continue_final_message=True)[0]
    got = client.chat(prefill, continue_final_message=True, **greedy())
    assert got.choices[0].token_ids == want.outputs[0].token_ids
    assert got.usage.prompt_tokens == len(want.prompt_token_ids) != len(offline.chat(prefill, GREEDY)[0].prompt_token_ids)
    streamed = client.stream(messages=prefill, continue_final_message=True, **greedy()).collect()
    assert streamed.choices[0].token_ids == want.outputs[0].token_ids
    with pytest.raises(ValueError, match="give messages"):
        client.generate(PROMPT, continue_final_message=True)


def test_the_http_apis_text_and_template_options_reach_grpc_too(client, offline, served, monkeypatch):
    """include_stop_str_in_output, skip_special_tokens and an independent add_generation_prompt had no
    form on the wire: such an HTTP request could not be sent over gRPC."""
    stop_word = offline.generate(PROMPT, GREEDY)[0].outputs[0].text.split()[2]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop_word],
                            include_stop_str_in_output=True, skip_special_tokens=False)
    want = offline.generate(PROMPT, params)[0].outputs[0]
    got = client.generate(PROMPT, stop=[stop_word], include_stop_str_in_output=True, skip_special_tokens=False,
                          **greedy())
    assert got.text == want.text and got.text.endswith(stop_word)
    seen, render = [], served[1].prompts.chat

    async def spy(*args, **template):
        seen.append(template["add_generation_prompt"])
        return await render(*args, **template)
    monkeypatch.setattr(served[1].prompts, "chat", spy)
    unopened = offline.chat(MESSAGES, GREEDY, add_generation_prompt=False)[0]
    got = client.chat(MESSAGES, add_generation_prompt=False, **greedy())
    assert got.choices[0].token_ids == unopened.outputs[0].token_ids and seen == [False]
    client.chat(MESSAGES, **greedy())
    assert seen == [False, True]
    with pytest.raises(InvalidArgumentError, match="add_generation_prompt"):
        client.chat([*MESSAGES, {"role": "assistant", "content": "w30"}], continue_final_message=True,
                    add_generation_prompt=True, **greedy())


def test_logit_bias_and_min_p_reach_the_target(client, offline):
    banned = offline.generate(PROMPT, GREEDY)[0].outputs[0].token_ids[0]
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, min_p=0.1,
                                                   logit_bias={banned: -100.0}))[0].outputs[0]
    got = client.generate(PROMPT, sampling=Sampling(min_p=0.1, logit_bias={banned: -100.0}, **greedy()))
    assert got.choices[0].token_ids == want.token_ids and banned not in want.token_ids[:1]
    with pytest.raises(InvalidArgumentError, match="logit_bias"):
        client.generate(PROMPT, logit_bias={banned: 1000.0})
    penalties = dict(presence_penalty=0.5, frequency_penalty=1.0, repetition_penalty=1.5, min_tokens=3,
                     stop_token_ids=[banned])
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **penalties))
    assert client.generate(PROMPT, **greedy(**penalties)).choices[0].token_ids == want[0].outputs[0].token_ids
    with pytest.raises(InvalidArgumentError, match="repetition_penalty"):
        client.generate(PROMPT, repetition_penalty=0.0)


def test_async_client(served, offline):
    want = offline.generate(PROMPT, GREEDY)[0].outputs[0]
    chat_want = offline.chat(MESSAGES, GREEDY)[0].outputs[0]

    async def main():
        async with AsyncClient(served[0].target, api_key=KEY, timeout=30) as c:
            got = await c.generate(PROMPT, **greedy())
            streamed = await c.stream(PROMPT, **greedy()).collect()
            chat = await c.chat(MESSAGES, **greedy())
            return got, streamed, chat, await c.models(), await c.health()

    got, streamed, chat, models, health = asyncio.run(main())
    assert got.choices[0].token_ids == streamed.choices[0].token_ids == want.token_ids
    assert chat.text == chat_want.text
    assert [m.id for m in models] == ["tiny"] and models[0].speculative_method == "ngram"
    assert models[0].max_model_len > 0 and health == "SERVING"


def test_n_seed_stop_and_logprobs(client):
    kw = dict(n=2, seed=5, max_tokens=6, logprobs=2)
    first, again = client.generate(PROMPT, **kw), client.generate(PROMPT, **kw)
    assert [c.token_ids for c in first.choices] == [c.token_ids for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1]
    lp = first.choices[0].logprobs
    assert len(lp) == len(first.choices[0].token_ids) and lp[0].logprob <= 0 and len(lp[0].top) == 2
    streamed = client.stream(PROMPT, **kw).collect()
    assert [c.token_ids for c in streamed.choices] == [c.token_ids for c in first.choices]
    assert streamed.model == first.model != ""  # the summary names the served model (it was "")
    assert [x.token_id for x in streamed.choices[1].logprobs] == streamed.choices[1].token_ids
    tok = first.choices[0].token_ids[1]
    stopped = client.generate(PROMPT, n=2, seed=5, max_tokens=6, stop_token_ids=[tok]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == tok and stopped.token_ids[-1] == tok


def test_logprob_token_texts_add_up_to_the_text(client):
    """Token texts are decoded in context, as the HTTP API's: alone, a word-level token loses its
    leading space. Unary and streamed alike."""
    kw = greedy(logprobs=1)
    whole = client.generate(PROMPT, **kw).choices[0]
    assert "".join(x.token for x in whole.logprobs) == whole.text and " " in whole.text
    assert all(x.top[0].token == x.token for x in whole.logprobs)  # greedy: the drawn token leads
    streamed = client.stream(PROMPT, **kw).collect().choices[0]
    assert "".join(x.token for x in streamed.logprobs) == streamed.text == whole.text


def test_standard_health_service(served):
    with grpc.insecure_channel(served[0].target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "specray.v1.Generation"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_count_grpc_requests(client, served):
    service = served[1]

    def count(name, **labels):
        return service.metrics.registry.get_sample_value(name, labels) or 0

    before = count("specray_request_success_total", finish_reason="length")
    client.generate(PROMPT, **greedy())
    assert count("specray_request_success_total", finish_reason="length") == before + 1
    assert count("specray_time_to_first_token_seconds_count") > 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make a test certificate")
def test_tls(tmp_path, served):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    with GrpcServerThread(served[1], credentials=creds) as server:
        with Client(server.target, api_key=KEY, root_certificates=cert, server_name="localhost", timeout=30) as c:
            assert c.generate(PROMPT, max_tokens=3).usage.completion_tokens == 3


def test_a_stream_never_sends_a_piece_of_its_stop_string(client, offline):
    """The deltas of a streamed request add up to the unary text when a stop string spans tokens."""
    out = offline.generate(PROMPT, GREEDY)[0].outputs[0]
    tok = offline.get_tokenizer()
    cuts = [len(tok.decode(out.token_ids[:k])) for k in range(1, len(out.token_ids) - 1)]
    cut = next(c for c in cuts if out.text.find(out.text[c - 2: c + 2]) == c - 2)  # a first occurrence
    stop = out.text[cut - 2: cut + 2]
    whole = client.generate(PROMPT, **greedy(stop=[stop])).choices[0]
    deltas = list(client.stream(PROMPT, **greedy(stop=[stop])))
    assert whole.text == out.text[: cut - 2] and whole.finish_reason == "stop"
    assert "".join(d.text for d in deltas) == whole.text


def test_top_logprobs_are_the_n_most_likely(client):
    lp = client.generate(PROMPT, **greedy(logprobs=3)).choices[0].logprobs
    for pos in lp:  # greedy: the drawn token leads its position's three
        assert len(pos.top) == 3 and pos.top[0].token_id == pos.token_id
        assert [t.logprob for t in pos.top] == sorted((t.logprob for t in pos.top), reverse=True)


def test_prompt_logprobs_unary_and_streamed(client, offline):
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2))[0]
    got = client.generate(PROMPT, **{**greedy(prompt_logprobs=2), "max_tokens": 4})
    assert [x.token_id for x in got.prompt_logprobs] == want.prompt_token_ids[1:]
    assert [x.logprob for x in got.prompt_logprobs] == pytest.approx(
        [e[t].logprob for e, t in zip(want.prompt_logprobs[1:], want.prompt_token_ids[1:])], rel=1e-6)
    assert all([t.token_id for t in x.top] == [t for t, lp in sorted(e.items(), key=lambda kv: kv[1].rank or 99)][:2]
               for x, e in zip(got.prompt_logprobs, want.prompt_logprobs[1:]))
    # each prompt token's rank in the vocabulary, also below the top 2 (HTTP's vLLM form had it, gRPC dropped it)
    assert [x.rank for x in got.prompt_logprobs] == [e[t].rank for e, t in zip(want.prompt_logprobs[1:],
                                                                             want.prompt_token_ids[1:])]
    assert any(x.rank > 2 for x in got.prompt_logprobs)
    stream = client.stream(PROMPT, **{**greedy(prompt_logprobs=2), "max_tokens": 4})
    list(stream)
    assert stream.summary.prompt_logprobs == got.prompt_logprobs
    assert client.generate(PROMPT, **{**greedy(), "max_tokens": 2}).prompt_logprobs is None


def test_usage_counts_the_prompt_tokens_found_in_the_prefix_cache(client):
    prompt = " ".join(f"w{40 + i % 30}" for i in range(45))  # a prompt no other test sends
    first, second = (client.generate(prompt, **greedy()) for _ in range(2))
    assert first.usage.cached_tokens == 0 and first.choices[0].token_ids == second.choices[0].token_ids
    assert second.usage.cached_tokens == (second.usage.prompt_tokens - 1) // 16 * 16 > 0


def test_a_cache_salt_keeps_prefix_cache_hits_within_the_salt(client):
    prompt = " ".join(f"w{60 + i % 30}" for i in range(45))  # a prompt no other test sends

    def cached(salt=None):
        return client.generate(prompt, **greedy(), **({"cache_salt": salt} if salt else {})).usage.cached_tokens

    assert [cached("tenant-1"), cached(), cached("tenant-2"), cached("tenant-1"), cached()] == [0, 0, 0, 32, 32]
    with pytest.raises(InvalidArgumentError, match="cache_salt"):
        cached("s" * 1025)


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(client, offline):
    ids = offline.get_tokenizer().encode(PROMPT)
    want = offline.generate({"prompt_token_ids": ids[-2:]}, GREEDY)[0].outputs[0]
    got = client.generate(PROMPT, **greedy(truncate_prompt_tokens=2))
    assert got.choices[0].token_ids == want.token_ids and got.usage.prompt_tokens == 2
    huge = "w5 " * 20000  # past the context: refused before tokenising unless the request cuts it
    with pytest.raises(InvalidArgumentError, match="characters"):
        client.generate(huge, max_tokens=2)
    assert client.generate(huge, max_tokens=2, truncate_prompt_tokens=3).usage.prompt_tokens == 3
    with pytest.raises(InvalidArgumentError, match="truncate_prompt_tokens"):
        client.generate(PROMPT, truncate_prompt_tokens=0)
    with pytest.raises(InvalidArgumentError, match="truncate_prompt_tokens"):
        client.generate(PROMPT, truncate_prompt_tokens=10**6)


def test_logprobs_are_rendered_off_the_event_loop(client, monkeypatch):
    """As over HTTP: a long prompt's logprobs (a decode per position and top-n entry) held the server's
    event loop, and every other call on it."""
    import threading

    from specray.cluster.serve import grpc_convert

    threads, real = [], grpc_convert.prompt_logprobs
    monkeypatch.setattr(grpc_convert, "prompt_logprobs", lambda *a: threads.append(
        threading.current_thread().name) or real(*a))
    client.generate(PROMPT, **{**greedy(prompt_logprobs=1), "max_tokens": 2})
    list(client.stream(PROMPT, **{**greedy(prompt_logprobs=1), "max_tokens": 2}))
    assert len(threads) == 2 and all(t.startswith("specray-render") for t in threads), threads
