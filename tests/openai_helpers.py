"""The engine the OpenAI API modules share (test_openai_api.py, test_openai_fields.py): a tiny target
with a draft behind the HTTP API, an API key, and the same target offline for reference outputs."""

import openai
import pytest

from specray import LLM
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer

KEY = "sk-test"
MESSAGES = [{"role": "user", "content": "w10 w11 w12"}]


@pytest.fixture(scope="module")
def offline(tiny_target):
    return LLM(str(tiny_target))


@pytest.fixture(scope="module")
def served(tiny_target, tiny_draft):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})
    router = AsyncRouter(llm.router)
    server = OpenAIServer(router, llm.get_tokenizer(), "tiny", api_key=KEY)
    with BackgroundServer(server.app) as http:
        yield http, router
    router.shutdown()


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key=KEY, max_retries=0)
