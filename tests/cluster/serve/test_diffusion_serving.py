"""A diffusion LM served: HTTP and gRPC (streaming and not, concurrency 1-8) return what the
in-process API returns; bad requests get clear 400s / INVALID_ARGUMENT; ServeConfig and the serve
flags take FreeDave and the blocks, and refuse what does not apply."""

import argparse
import asyncio
import json

import httpx
import pytest
from diffusion_helpers import save_tiny_dllm

from specray import LLM, SamplingParams
from specray.client import AsyncClient
from specray.cluster.config.serve import ServeConfig
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer

SPEC, DIFFUSION = {"method": "freedave", "num_drafts": 3}, {"block_length": 4}
PROMPTS = [" ".join(f"w{(7 * i + j) % 40 + 3}" for j in range(2 + i % 4)) for i in range(8)]


def params(i: int) -> dict:
    return {"temperature": 0, "max_tokens": 5 + i % 6, "ignore_eos": True, **({"stop": ["w20"]} if i % 3 == 0 else {})}


@pytest.fixture(scope="module")
def dllm(tmp_path_factory):
    return save_tiny_dllm(tmp_path_factory.mktemp("dllm"), "dream", scale=6.0)


@pytest.fixture(scope="module")
def want(dllm):
    llm = LLM(str(dllm), speculative_config=SPEC, diffusion_config=DIFFUSION)
    outs = llm.generate(PROMPTS, [SamplingParams(**params(i)) for i in range(len(PROMPTS))])
    static = LLM(str(dllm), diffusion_config=DIFFUSION).generate(PROMPTS, [SamplingParams(**params(i))
                                                                          for i in range(len(PROMPTS))])
    got = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]
    assert got == [(o.outputs[0].text, o.outputs[0].finish_reason) for o in static]
    return got


@pytest.fixture(scope="module")
def served(dllm):
    llm = LLM(str(dllm), speculative_config=SPEC, diffusion_config=DIFFUSION, max_num_seqs=8)
    router = AsyncRouter(llm.router)
    tok = llm.get_tokenizer()
    service = GenerationService(router, tok, "tiny", speculative_method="freedave")
    with BackgroundServer(OpenAIServer(router, tok, "tiny").app) as http, GrpcServerThread(service) as grpc_:
        yield http.url, grpc_.target
    router.shutdown()


async def http_one(client, url, i, stream):
    body = {"model": "tiny", "prompt": PROMPTS[i], "stream": stream, **params(i)}
    if not stream:
        choice = (await client.post(url + "/v1/completions", json=body)).json()["choices"][0]
        return choice["text"], choice["finish_reason"]
    text, reason = "", None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                text, reason = text + c["text"], c["finish_reason"]
    return text, reason


async def grpc_one(client, i, stream):
    done = await (client.stream(PROMPTS[i], **params(i)).collect() if stream else client.generate(PROMPTS[i], **params(i)))
    return done.choices[0].text, done.choices[0].finish_reason


async def all_requests(url, target, concurrency, stream):
    limit = asyncio.Semaphore(concurrency)

    async def limited(call):
        async with limit:
            return await call

    async with httpx.AsyncClient(timeout=60) as h, AsyncClient(target, timeout=60) as g:
        http = await asyncio.gather(*(limited(http_one(h, url, i, stream)) for i in range(len(PROMPTS))))
        rpc = await asyncio.gather(*(limited(grpc_one(g, i, stream)) for i in range(len(PROMPTS))))
    return http, rpc


@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.parametrize("stream", [True, False])
def test_http_and_grpc_equal_in_process(served, want, concurrency, stream):
    http, rpc = asyncio.run(all_requests(*served, concurrency, stream))
    assert list(http) == want and list(rpc) == want


def test_bad_requests_get_clear_errors_over_http_and_grpc(served):
    url, target = served
    with httpx.Client(timeout=30) as c:
        for body, words in [({"logprobs": 2}, "logprobs"), ({"max_tokens": 600}, "context is"),
                            ({"verify_budget": 2}, "do not apply to a diffusion LM")]:  # was dropped
            r = c.post(url + "/v1/completions", json={"model": "tiny", "prompt": "w5", **body})
            assert r.status_code == 400 and words in r.json()["error"]["message"]
            assert r.json()["error"]["param"] == next(iter(body))  # it was null: plain ValueErrors
        long = {"model": "tiny", "prompt": [5] * 490, "ignore_eos": True}  # 22 slots left: 5 blocks of 4
        cut = c.post(url + "/v1/completions", json=long).json()  # the default 256, cut (it was refused)
        assert cut["usage"]["completion_tokens"] == 20 and cut["choices"][0]["finish_reason"] == "length"
        r = c.post(url + "/v1/completions", json={**long, "max_tokens": 21})  # fits, but not its canvas
        assert r.status_code == 400 and "a canvas of 24: whole blocks of 4" in r.json()["error"]["message"]
        full = {**long, "prompt": [5] * 509, "max_tokens": 2}  # 3 slots: no whole block, whatever max_tokens
        r = c.post(url + "/v1/completions", json=full)  # it named max_tokens
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        ok = c.post(url + "/v1/completions", json={"model": "tiny", "prompt": "w5", "max_tokens": 4})
        assert ok.status_code == 200
        metrics = c.get(url + "/metrics").text
        calls = float(next(line.split()[-1] for line in metrics.splitlines()
                           if line.startswith("specray_diffusion_model_calls_total")))
        steps = float(next(line.split()[-1] for line in metrics.splitlines()
                           if line.startswith("specray_diffusion_steps_total")))
        assert calls > 0 and steps >= calls - len(PROMPTS) * 4  # steps per call near or above one

    async def grpc_bad():
        import grpc

        async with AsyncClient(target, timeout=30) as client:
            with pytest.raises(Exception) as err:
                await client.generate("w5", max_tokens=600)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "context is" in str(err.value)
            with pytest.raises(Exception) as err:  # the wire had no field for it
                await client.generate("w5", max_tokens=4, verify_budget=2)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "verify_budget" in str(err.value)
    asyncio.run(grpc_bad())


def test_serve_config_and_flags(dllm, tiny_target):
    cfg = ServeConfig.from_dict({"model": str(dllm)})
    assert cfg.diffusion and cfg.speculative is None and cfg.decode_options().num_drafts >= 1
    cfg = ServeConfig.from_dict({"model": str(dllm), "speculative_config": {"method": "freedave", "num_drafts": 2},
                                 "diffusion_config": {"block_length": 8, "steps_per_block": 4}})
    options = cfg.decode_options()
    assert (options.num_drafts, options.block_length, options.steps) == (2, 8, 4)
    for bad, words in [({"speculative_config": {"method": "ngram"}}, "freedave"),
                       ({"speculative_config": {"method": "freedave", "model": "x"}}, "no draft model"),
                       ({"diffusion_config": {"block_length": 0}}, "block_length"),
                       ({"pools": {"target": {"num_workers": 2}}}, "one worker"),
                       ({"pools": {"target": {"kernels": "fast"}}}, "is a diffusion LM"),  # was served exact
                       # no draft pool: a drafter's address was ignored
                       ({"transport": {"kind": "grpc", "drafter_address": "h:1"}}, "transport apply to"),
                       ({"generation_config": "/some/folder"}, "generation_config apply to")]:
        with pytest.raises(ValueError, match=words):
            ServeConfig.from_dict({"model": str(dllm), **bad})
    with pytest.raises(ValueError, match="autoregressive"):
        ServeConfig.from_dict({"model": str(tiny_target), "diffusion_config": {"block_length": 8}})
    from specray.cluster.serve.banner import endpoint_banner
    from specray.cluster.serve.cli import add_serve_flags, resolve_config

    assert "transport" not in endpoint_banner(cfg, {})  # a diffusion LM has no draft pool to reach
    assert "transport: " in endpoint_banner(ServeConfig.from_dict({"model": str(tiny_target)}), {})

    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    cfg = resolve_config(parser.parse_args(["--model", str(dllm), "--num-drafts", "5", "--block-length", "8"]))
    assert cfg.decode_options().num_drafts == 5 and cfg.decode_options().block_length == 8
    with pytest.raises(ValueError, match="autoregressive"):
        resolve_config(parser.parse_args(["--model", str(tiny_target), "--num-drafts", "5"]))
    # `none` is static decoding, with other flags or alone; 0 drafts and `none` beside drafts are refused
    for flags in (["--speculative-method", "none"], ["--speculative-method", "none", "--block-length", "8"]):
        assert resolve_config(parser.parse_args(["--model", str(dllm), *flags])).decode_options().num_drafts == 1
    for flags, words in ((["--num-drafts", "0"], "--num-drafts must be an integer >= 1"),
                         (["--speculative-method", "none", "--num-drafts", "3"], "static decoding"),
                         # an autoregressive model's speculation flags were dropped in silence beside these
                         (["--num-drafts", "2", "--num-speculative-tokens", "7"], "--num-speculative-tokens"),
                         (["--block-length", "8", "--lookup-first"], "--lookup-first"),
                         (["--speculative-config", '{"method": "freedave"}', "--num-drafts", "3"], "whole")):
        with pytest.raises(ValueError, match=words):
            resolve_config(parser.parse_args(["--model", str(dllm), *flags]))
    # --speculative-config beside the block flags is FreeDave's whole config (its num_drafts was replaced)
    cfg = resolve_config(parser.parse_args(["--model", str(dllm), "--speculative-config",
                                            '{"method": "freedave", "num_drafts": 8}', "--block-length", "16"]))
    assert cfg.decode_options().num_drafts == 8 and cfg.decode_options().block_length == 16


def test_serve_flags_change_their_keys_of_the_config_file_only(dllm, tmp_path):
    """--num-drafts or --block-length rebuilt the file's FreeDave and block settings from the flags
    alone (its block of 16 served as 32, its static decoding turned FreeDave on): outputs changed."""
    from specray.cluster.serve.cli import add_serve_flags, resolve_config

    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    tuned, static = tmp_path / "tuned.yaml", tmp_path / "static.yaml"
    tuned.write_text(f"model: {dllm}\nspeculative_config: {{method: freedave, num_drafts: 8, adaptive: false}}\n"
                     "diffusion_config: {block_length: 16, steps_per_block: 8}\n")
    static.write_text(f"model: {dllm}\nspeculative_config: null\n")

    def served(path, *flags):
        cfg = resolve_config(parser.parse_args(["--config", str(path), *flags]))
        return cfg.speculative_config, cfg.diffusion_config

    assert served(tuned, "--num-drafts", "2") == ({"method": "freedave", "num_drafts": 2, "adaptive": False},
                                                  {"block_length": 16, "steps_per_block": 8})
    assert served(tuned, "--block-length", "32") == ({"method": "freedave", "num_drafts": 8, "adaptive": False},
                                                     {"block_length": 32, "steps_per_block": 8})
    assert served(static, "--block-length", "16") == (None, {"block_length": 16})
    with pytest.raises(ValueError, match="takes none of --num-speculative-tokens"):  # not "got method 'ngram'"
        resolve_config(parser.parse_args(["--model", str(dllm), "--num-speculative-tokens", "3"]))


def test_a_block_the_context_cannot_hold_fails_before_ray_starts(dllm, tmp_path):
    """It loaded the weights in the replica first, then failed the deployment after Serve's retries;
    and a generation_config.json's end of turn counts as EOS, as for autoregressive models."""
    import json
    import shutil

    from specray.cluster.serve.cli import check_model_and_context
    from specray.kernels.diffusion.weights import read_config

    cfg = ServeConfig.from_dict({"model": str(dllm), "router": {"max_model_len": 16},
                                 "diffusion_config": {"block_length": 16}})
    with pytest.raises(ValueError, match="no room for a prompt"):
        check_model_and_context(cfg)
    folder = shutil.copytree(dllm, tmp_path / "with_generation_config")
    eos = read_config(folder).model.eos_token_ids
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert read_config(folder).model.eos_token_ids == (*eos, 7)
