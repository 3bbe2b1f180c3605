"""A client that knows nothing but the server's address: it learns the Generation service from
server reflection and calls Generate with dynamically built messages (no generated stubs; it
runs in a fresh interpreter that never imports specray)."""

import json
import subprocess
import sys
import textwrap

import pytest

from specray import LLM, SamplingParams
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService

REFLECTION_CLIENT = textwrap.dedent("""
    import json, sys
    import grpc
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    channel = grpc.insecure_channel(sys.argv[1])
    database = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(database.get_services())
    pool = descriptor_pool.DescriptorPool(database)
    method = pool.FindServiceByName("specray.v1.Generation").FindMethodByName("Generate")
    Request = message_factory.GetMessageClass(method.input_type)
    Response = message_factory.GetMessageClass(method.output_type)
    request = Request(text="w20 w21 w22")
    request.sampling.temperature = 0
    request.sampling.max_tokens = 8
    request.sampling.ignore_eos = True
    call = channel.unary_stream("/specray.v1.Generation/Generate", request_serializer=Request.SerializeToString,
                                response_deserializer=Response.FromString)
    tokens, summary = [], None
    for msg in call(request, timeout=30):
        if msg.WhichOneof("event") == "delta":
            tokens += list(msg.delta.token_ids)
        else:
            summary = msg.summary
    print(json.dumps({"services": services, "tokens": tokens, "completion_tokens": summary.usage.completion_tokens,
                      "specray_imported": any(m.startswith("specray") for m in sys.modules)}))
""")


@pytest.fixture(scope="module")
def server(tiny_target):
    llm = LLM(str(tiny_target), speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    router = AsyncRouter(llm.router)
    with GrpcServerThread(GenerationService(router, llm.get_tokenizer(), "tiny")) as running:
        yield running
    router.shutdown()


def test_reflection_only_client_calls_generate(server, tiny_target):
    want = LLM(str(tiny_target)).generate("w20 w21 w22", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    result = subprocess.run([sys.executable, "-c", REFLECTION_CLIENT, server.target],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert {"specray.v1.Generation", "grpc.health.v1.Health"} <= set(got["services"])
    assert got["tokens"] == want[0].outputs[0].token_ids and got["completion_tokens"] == 8
    assert not got["specray_imported"]
