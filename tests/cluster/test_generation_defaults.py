"""The model's recommended sampling defaults (vLLM's --generation-config): generation_config.json's
temperature, top_k, top_p, min_p, repetition_penalty and max_new_tokens fill the options a request
leaves unset, offline, over HTTP and over gRPC; a request's own values win; "vllm" ignores the file."""

import json
import shutil

import httpx
import pytest

from specray import LLM, SamplingParams
from specray.client import Client
from specray.cluster.generation_defaults import sampling_defaults
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer
from specray.kernels.config import generation_sampling

PROMPT = [5, 9, 14, 5, 9]
RECOMMENDED = {"temperature": 0.0, "max_new_tokens": 5, "top_k": 50, "top_p": 1.0, "do_sample": True}


@pytest.fixture(scope="module")
def folder(tiny_target, tmp_path_factory):
    """The tiny target with a generation_config.json that recommends greedy decoding of 5 tokens."""
    copy = tmp_path_factory.mktemp("recommending") / "model"
    shutil.copytree(tiny_target, copy)
    (copy / "generation_config.json").write_text(json.dumps({**RECOMMENDED, "eos_token_id": 2}))
    return copy


def test_only_fields_that_differ_from_hugging_faces_defaults_are_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"temperature": 0.5, "top_p": 0.9}))
    assert generation_sampling(tmp_path) == {"temperature": 0.5, "top_p": 0.9}  # a legacy config.json's, alone
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({**RECOMMENDED, "repetition_penalty": 1.1, "min_p": 0.05, "bos_token_id": 1}))
    assert generation_sampling(tmp_path) == {"temperature": 0.0, "max_tokens": 5, "repetition_penalty": 1.1,
                                             "min_p": 0.05}  # top_k 50 and top_p 1.0 are Hugging Face's own
    assert generation_sampling(tmp_path / "absent") == {}
    assert sampling_defaults("vllm", tmp_path) == {} and sampling_defaults(tmp_path, tmp_path / "x")["min_p"] == 0.05
    assert sampling_defaults("auto", tmp_path, diffusion=True) == {}
    with pytest.raises(ValueError, match="diffusion LM takes 'auto' or 'vllm'"):
        sampling_defaults(str(tmp_path), tmp_path, diffusion=True)
    path.write_text(json.dumps({"temperature": -1}))
    with pytest.raises(ValueError, match="generation config: temperature"):
        sampling_defaults("auto", tmp_path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read as JSON"):
        sampling_defaults("auto", tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        sampling_defaults(str(tmp_path / "nowhere"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no generation_config.json"):  # it gave OpenAI's defaults, silently
        sampling_defaults(str(tmp_path / "empty"), tmp_path)


def test_the_offline_api_takes_them_when_no_parameters_are_given(folder, tiny_target):
    greedy = LLM(str(tiny_target)).generate({"prompt_token_ids": PROMPT},
                                            SamplingParams(temperature=0, max_tokens=5))[0].outputs[0].token_ids
    llm = LLM(str(folder))
    assert llm.get_default_sampling_params().max_tokens == 5
    assert llm.generate({"prompt_token_ids": PROMPT})[0].outputs[0].token_ids == greedy
    ignored = LLM(str(folder), generation_config="vllm")
    assert ignored.get_default_sampling_params() == SamplingParams()  # vLLM's: 16 tokens at temperature 1
    with pytest.raises(ValueError, match="generation_config must be"):
        LLM(str(folder), generation_config="")


@pytest.fixture(scope="module")
def servers(folder):
    llm = LLM(str(folder))
    router = AsyncRouter(llm.router)
    http = OpenAIServer(router, llm.get_tokenizer(), "m", sampling_defaults=llm.sampling_defaults)
    grpc = GenerationService(router, llm.get_tokenizer(), "m", sampling_defaults=llm.sampling_defaults)
    with BackgroundServer(http.app) as h, GrpcServerThread(grpc) as g:
        yield h.url, g.target
    router.shutdown()


def test_http_and_grpc_fill_only_what_a_request_leaves_unset(servers, tiny_target):
    reference = LLM(str(tiny_target))
    want = reference.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=5))[0]
    http, grpc = servers
    body = {"model": "m", "prompt": PROMPT}
    plain = httpx.post(http + "/v1/completions", json=body).json()["choices"][0]
    assert plain["text"] == want.outputs[0].text  # greedy, 5 tokens: the model's recommendation
    own = httpx.post(http + "/v1/completions", json={**body, "max_tokens": 3}).json()["choices"][0]
    assert own["text"] == reference.generate({"prompt_token_ids": PROMPT}, SamplingParams(
        temperature=0, max_tokens=3))[0].outputs[0].text
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=5, ignore_eos=True)
    got = httpx.post(http + "/v1/completions", json={**body, "temperature": 1.0, "seed": 3,
                                                     "ignore_eos": True}).json()["choices"][0]
    assert got["text"] == reference.generate({"prompt_token_ids": PROMPT}, sampled)[0].outputs[0].text
    with Client(grpc) as client:
        assert client.generate(PROMPT).choices[0].token_ids == want.outputs[0].token_ids
        assert client.generate(PROMPT, temperature=1.0, seed=3, ignore_eos=True).choices[0].token_ids == \
            reference.generate({"prompt_token_ids": PROMPT}, sampled)[0].outputs[0].token_ids


def test_grpc_tells_an_explicit_zero_from_an_unset_field():
    """top_k and min_p have presence on the wire: 0 turns a model's top_k or min_p off."""
    from specray.client import Sampling
    from specray.cluster.serve.grpc_convert import sampling_params

    model = {"top_k": 20, "min_p": 0.05, "temperature": 0.7, "max_tokens": 300}
    unset = sampling_params(Sampling().to_proto(), 256, defaults=model)
    assert (unset.top_k, unset.min_p, unset.temperature, unset.max_tokens) == (20, 0.05, 0.7, 300)
    off = sampling_params(Sampling(top_k=0, min_p=0.0, temperature=1.0, max_tokens=8).to_proto(), 256, defaults=model)
    assert (off.top_k, off.min_p, off.temperature, off.max_tokens) == (0, 0.0, 1.0, 8)
    assert sampling_params(Sampling().to_proto(), 256).max_tokens == 256
