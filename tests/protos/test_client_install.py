"""`pip install ./protos` into a clean virtualenv gives a working client SDK with grpcio and
protobuf only: no torch, no ray, and `specray` is a namespace package there."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specray import LLM
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService

ROOT = Path(__file__).resolve().parents[2]
NO_INDEX = ("Could not find a version", "No matching distribution", "Failed to establish", "Temporary failure",
            "Network is unreachable", "ProxyError")

USE_THE_SDK = textwrap.dedent("""
    import asyncio, json, sys
    import specray
    from specray.client import AsyncClient, Client

    with Client(sys.argv[1], api_key="k", timeout=30) as c:
        full = c.generate("w20 w21 w22", max_tokens=5, temperature=0, ignore_eos=True)
        streamed = c.stream("w20 w21 w22", max_tokens=5, temperature=0, ignore_eos=True).collect()
        health = c.health()

    async def main():
        async with AsyncClient(sys.argv[1], api_key="k", timeout=30) as c:
            return [m.id for m in await c.models()]

    print(json.dumps({"tokens": full.choices[0].token_ids, "streamed": streamed.choices[0].token_ids,
                      "health": health, "models": asyncio.run(main()),
                      "namespace": getattr(specray, "__file__", None) is None,
                      "heavy": sorted(m for m in ("torch", "ray", "transformers") if m in sys.modules)}))
""")


def run(*args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("client_venv")
    shutil.copytree(ROOT / "protos", tmp / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    made = run(sys.executable, "-m", "venv", tmp / "venv", timeout=120)
    if made.returncode != 0:
        pytest.skip(f"python -m venv does not work here: {made.stderr.strip()[-300:]}")
    python = tmp / "venv" / "bin" / "python"
    installed = run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", tmp / "src", timeout=240)
    if installed.returncode != 0 and any(s in installed.stderr for s in NO_INDEX):
        pytest.skip(f"no package index reachable to install grpcio/protobuf: {installed.stderr.strip()[-300:]}")
    assert installed.returncode == 0, installed.stderr
    return python


@pytest.mark.venv
def test_client_installs_alone_and_works(venv_python, tiny_target):
    listed = run(venv_python, "-m", "pip", "list", "--format=json", timeout=60)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"specray-client", "grpcio", "protobuf"} <= names
    assert not names & {"torch", "ray", "transformers", "specray"}

    llm = LLM(str(tiny_target), speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    router = AsyncRouter(llm.router)
    with GrpcServerThread(GenerationService(router, llm.get_tokenizer(), "tiny", api_key="k")) as server:
        used = run(venv_python, "-c", USE_THE_SDK, server.target, timeout=120, cwd=venv_python.parent)
    router.shutdown()
    assert used.returncode == 0, used.stderr
    got = json.loads(used.stdout)
    assert got["tokens"] == got["streamed"] and len(got["tokens"]) == 5
    assert got["health"] == "SERVING" and got["models"] == ["tiny"]
    assert got["namespace"] and got["heavy"] == []
