"""`specray serve`: config file + flags resolve into one ServeConfig, bad config exits 2 with the
reason, and the real command starts a local Ray cluster and answers HTTP requests."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from specray import LLM, SamplingParams
from specray.cluster.cli import main
from specray.cluster.serve.http_server import free_port

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/conftest.py)


def test_dry_run_merges_file_and_flags(tmp_path, capsys):
    import yaml

    path = tmp_path / "serve.yaml"
    path.write_text("model: some-model\nrouter: {max_num_seqs: 4}\nspeculative_config: {method: ngram, "
                    "num_speculative_tokens: 3}\npools: {target: {threads: 2}}\n")
    assert main(["serve", "--config", str(path), "--port", "8123", "--no-pipeline", "--dry-run"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["model"] == "some-model" and cfg["http"]["port"] == 8123 and cfg["router"]["max_num_seqs"] == 4
    assert cfg["router"]["pipelined"] is False and cfg["speculative_config"]["num_speculative_tokens"] == 3
    assert cfg["pools"]["target"]["threads"] == 2 and cfg["pools"]["target"]["resources"] == {"target": 1.0}


@pytest.mark.parametrize("flags, pipelined", [
    ([], False),  # smollm2-135m's default drafts for a lone sequence only: two groups would never both draft
    (["--speculative-method", "ngram"], False),  # n-gram costs nothing to overlap: one group
    (["--speculative-method", "draft_model", "--draft-model", "d"], True),
    (["--speculative-method", "draft_model", "--draft-model", "d", "--pipeline", "off"], False),
    (["--pipeline", "on"], True),
    (["--speculative-method", "none"], False),
])
def test_pipeline_auto_pipelines_only_model_drafts(flags, pipelined):
    from specray.cluster.cli import build_parser
    from specray.cluster.serve.cli import resolve_config

    args = build_parser().parse_args(["serve", *flags])
    cfg = resolve_config(args)
    assert cfg.pipelined is pipelined
    assert cfg.router.pipelined == ("auto" if "--pipeline" not in flags else {"on": True, "off": False}[flags[-1]])


@pytest.mark.parametrize("text, message", [
    ("routr: {}\n", "routr: unknown key"),
    ("router: {pipelined: sometimes}\n", "router.pipelined"),
    ("router: {max_num_seqs: 0}\n", "router.max_num_seqs"),
    ("router: {max_prefill_tokens: 0}\n", "router.max_prefill_tokens: must be a positive integer, 'auto' or null"),
    ("router: {max_prefill_tokens: lots}\n", "got 'lots'"),
    ("speculative_config: {method: magic}\n", "unknown speculative method"),
    ("transport: {kind: grpc}\n", "drafter_address"),
    ("speculative_config: {method: ngram, layer_parallel: 2}\n", "'layer_parallel' needs method 'draft_model'"),
    ("speculative_config: {method: draft_model, model: d, layer_parallel: 0}\n", "layer_parallel must be"),
    ("pools: {draft: {num_workers: 2}}\n", "needs speculative_config.layer_parallel >= 2"),
    ("grpc: {server: proxy}\n", "grpc.server 'proxy' needs http.server 'proxy'"),
    ("speculative_config: {method: draft_model, model: d, layer_parallel: 2}\n"
     "pools: {draft: {num_workers: 2, device: cuda}}\n", "needs pools.draft.num_gpus >= 1"),
    ("- a\n- b\n", "mapping"),
    ("grpc: {enabled: 'yes'}\n", "grpc.enabled: Input should be a valid boolean"),  # types as the HTTP API's
    ("router: {max_num_seqs: '32'}\n", "router.max_num_seqs: Input should be a valid integer"),
    ("router: {max_num_seqs: true}\n", "router.max_num_seqs: Input should be a valid integer"),
    ("transport: {drafter_address: 'h:1'}\n", "drafter_address is for transport.kind 'grpc'"),  # was ignored
    ("transport: {kind: grpc, drafter_address: nonsense}\n", "drafter_address must be host:port"),  # waited, then no drafter
    ("transport: {kind: inline, master_port: 29500}\n", "master_port is for transport.kind 'torch_distributed'"),
    ("served_model_name: ''\n", "served_model_name: String should have at least 1 character"),
    ("http: {host: ''}\n", "http.host: String should have at least 1 character"),
    # were taken, then a worker failed on them (KeyError) or did nothing with them
    ("pools: {target: {dtype: half}}\n", "pools.target.dtype: unknown dtype 'half'"),
    ("pools: {draft: {device: tpu}}\n", "pools.draft.device: unknown device 'tpu'"),
    ("pools: {target: {kernels: fast, device: cuda}}\n", "kernels 'fast' is a CPU kernels' mode"),
    ("pools: {target: {kernels: fast16, dtype: bfloat16}}\n", "kernels 'fast16' is a CPU kernels' mode"),
    ("pools: {draft: {resources: {x: .nan}}}\n", "resource amounts must be finite and > 0"),
    ("pools: {draft: {resources: {x: .inf}}}\n", "resource amounts must be finite and > 0"),
    ("grpc: {idle_timeout_s: 3000000.0}\n", "grpc.idle_timeout_s: Input should be less than or equal to 2147483"),
    ("router: {max_num_seqs: 4}\nrouter: {block_size: 8}\n", "key 'router' given twice"),  # the last one won
    ("model: 123\n", "model: Input should be a valid string"),  # was a TypeError's traceback
    # passed the dry run, then failed in the deployment naming no key ("Value out of range")
    ("router: {max_num_seqs: 100000000000000000000}\n", "router.max_num_seqs: must be at most 2147483647"),
    ("pools: {target: {num_cpus: .inf}}\n", "pools.target.num_cpus: must be a finite number"),
])
def test_bad_config_exits_2_with_the_reason(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["serve", "--config", str(path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_a_config_that_cannot_be_read_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe model")
    for path in (tmp_path, tmp_path / "binary.yaml"):
        assert main(["serve", "--config", str(path), "--dry-run"]) == 2
        assert f"config file {path} cannot be read" in capsys.readouterr().err


def test_auto_dtype_is_float32():
    from specray.cluster.config.serve import ServeConfig

    assert ServeConfig.from_dict({"pools": {"target": {"dtype": "auto"}}}).pools.target.dtype == "float32"


@pytest.mark.parametrize("flag, budget", [("auto", "auto"), ("64", 64)])
def test_prefill_budget_flag(flag, budget, capsys):
    """--max-prefill-tokens: a number, or auto (the default: the target device's budgets, resolved
    where the router is built)."""
    from specray.cluster.cli import build_parser
    from specray.cluster.serve.cli import resolve_config

    assert resolve_config(build_parser().parse_args(["serve", "--max-prefill-tokens", flag])).router.max_prefill_tokens == budget
    assert resolve_config(build_parser().parse_args(["serve"])).router.max_prefill_tokens == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-prefill-tokens", "many"])
    assert "expected an integer or 'auto', got 'many'" in capsys.readouterr().err


def test_conflicting_or_missing_things_exit_2_before_anything_starts(capsys, monkeypatch, tiny_target):
    """A method that runs no draft beside --draft-model, one port for both servers, a model that is
    not there and a context the model or the KV cache cannot hold (a local cluster's workers would
    fail deploying them) are refused up front."""
    import specray.cluster.serve.local_ray as local_ray

    monkeypatch.setattr(local_ray, "start_ray", lambda cfg: pytest.fail("Ray must not start"))
    assert main(["serve", "--speculative-method", "ngram", "--draft-model", "smollm2-135m-draft", "--dry-run"]) == 2
    assert "--draft-model needs a method" in capsys.readouterr().err
    assert main(["serve", "--speculative-method", "none", "--lookup-first", "--dry-run"]) == 2
    assert "none turns speculation off; drop --lookup-first" in capsys.readouterr().err
    assert main(["serve", "--port", "9000", "--dry-run"]) == 2
    assert "grpc.port are both 9000" in capsys.readouterr().err
    assert main(["serve", "--model", "/no/such/model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_target), "--max-model-len", "100000"]) == 2  # the model's is 512
    assert "max_model_len must be in [2, 512]" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_target), "--kv-cache-tokens", "32", "--max-model-len", "60"]) == 2
    assert "does not fit in the KV cache" in capsys.readouterr().err
    assert main(["serve", "--speculative-method", "draft_model", "--draft-model", "smollm2-135m-eagle"]) == 2
    assert "feature-level draft (eagle.json), not a standalone draft model: use method 'eagle'" in capsys.readouterr().err
    assert main(["serve", "--model", "smollm2-135m-eagle"]) == 2
    assert "not a model that runs alone" in capsys.readouterr().err
    assert main(["serve", "--speculative-config", '{"method": "aded", "aded": {"corpus": "/no/such.txt"}}']) == 2
    assert "aded corpus '/no/such.txt' is not a file" in capsys.readouterr().err
    assert main(["serve", "--speculative-config", '{"model": "smollm2-135m-draft", "draft_num_layers": 99}']) == 2
    assert "draft_num_layers 99 exceeds the draft 'smollm2-135m-draft''s" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_target), "--generation-config", "/no/such/folder"]) == 2
    assert "generation_config: /no/such/folder is not a folder" in capsys.readouterr().err


def test_speculation_flags(capsys):
    import yaml

    assert main(["serve", "--speculative-method", "none", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] is None
    assert main(["serve", "--draft-model", "d", "--speculative-method", "draft_model",
                 "--num-speculative-tokens", "4", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == {
        "num_speculative_tokens": 4, "method": "draft_model", "model": "d"}
    # a draft model without a method: its folder says which (the default's method is ngram)
    assert main(["serve", "--draft-model", "d", "--dry-run"]) == 0
    spec = yaml.safe_load(capsys.readouterr().out)["speculative_config"]
    assert spec["method"] == "draft_model" and "prompt_lookup_min" not in spec  # the default's lookup keys stay behind
    # the same config as --speculative-method draft_model: the default's adaptive extras stayed with it
    assert main(["serve", "--draft-model", "smollm2-135m-draft", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == {
        "num_speculative_tokens": 2, "method": "draft_model", "model": "smollm2-135m-draft"}
    # an eagle draft alone gets eagle's recipe, and --lookup-first keeps the recipe's model_tokens (it was True)
    recipe = {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4,
              "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": True}
    for flags in (["--draft-model", "smollm2-135m-eagle"], ["--speculative-method", "eagle", "--lookup-first"]):
        assert main(["serve", *flags, "--dry-run"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == recipe, flags
    assert main(["serve", "--speculative-method", "ngram", "--dry-run"]) == 0  # the CPU default itself
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 2,
        "adaptive": True}
    # a model-draft method alone: the target's packaged draft of that kind
    assert main(["serve", "--speculative-method", "draft_model", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == {
        "num_speculative_tokens": 2, "method": "draft_model", "model": "smollm2-135m-draft"}


def test_speculative_config_json_replaces_the_files(tmp_path, capsys):
    """--speculative-config is the whole speculative_config (over the --config file's); beside another
    speculation flag it is refused, and a bad one is refused with the reason."""
    import json

    import yaml

    path = tmp_path / "serve.yaml"
    path.write_text("speculative_config: {method: ngram, num_speculative_tokens: 3}\n")
    tree = {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4,
            "tree": {"kind": "topk", "k": 3, "width": 4}, "verify_budget": 24, "lookup_first": True}
    assert main(["serve", "--config", str(path), "--speculative-config", json.dumps(tree), "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == tree
    assert main(["serve", "--speculative-config", json.dumps(tree), "--lookup-first", "--dry-run"]) == 2
    assert "put --lookup-first inside it" in capsys.readouterr().err
    assert main(["serve", "--speculative-config", json.dumps({**tree, "verify_budget": 0}), "--dry-run"]) == 2
    assert "verify_budget" in capsys.readouterr().err


def test_default_speculation_follows_the_device(tmp_path, capsys):
    """On CPU and on an accelerator the default is adaptive prompt lookup, off from two running
    sequences (measured: cluster/config/defaults.py); asking for eagle gets the packaged trained
    draft behind prompt lookup."""
    import yaml

    cpu = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 2,
           "adaptive": True}
    trained = {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4,
               "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": True}
    assert main(["serve", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == cpu
    path = tmp_path / "gpu.yaml"
    path.write_text("pools: {target: {device: cuda, num_gpus: 1}}\n")
    assert main(["serve", "--config", str(path), "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == cpu
    assert main(["serve", "--config", str(path), "--dry-run", "--speculative-method", "eagle"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == trained
    assert main(["serve", "--dry-run", "--speculative-method", "eagle"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == trained
    assert main(["serve", "--dry-run", "--adaptive-speculation", "off"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"]["adaptive"] is False
    from specray.cluster.config.serve import ServeConfig

    eagle = {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 2}
    assert ServeConfig().pipelined is False  # it drafts for a lone sequence only: nothing to overlap
    assert ServeConfig.from_dict({"speculative_config": eagle}).pipelined is True
    assert ServeConfig.from_dict({"speculative_config": {**eagle, "disable_by_batch_size": 3}}).pipelined is True
    assert main(["serve", "--model", "other-model", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == cpu
    assert main(["serve", "--model", "other-model", "--config", str(path), "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["speculative_config"] == cpu


def test_specray_serve_starts_and_answers(tiny_target, tmp_path):
    port = free_port()
    env = {**os.environ, "RAY_ADDRESS": "", "SPECRAY_API_KEY": ""}
    env.pop("RAY_ADDRESS")
    grpc_port, key_file, key, cert = free_port(), tmp_path / "key", tmp_path / "tls.key", tmp_path / "tls.pem"
    key_file.write_text("sk-file\n")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "specray.cluster.cli", "serve", "--model", str(tiny_target),
         "--port", str(port), "--grpc-port", str(grpc_port), "--kv-cache-tokens", "4096", "--api-key-file", str(key_file),
         "--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key), "--colocate", "auto"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    banner = []
    try:
        deadline = time.monotonic() + 240
        while not any("Ctrl-C" in line for line in banner):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(banner[-40:])
            banner.append(proc.stdout.readline())
        text = "".join(banner)
        assert f"http://127.0.0.1:{port}/v1" in text and "curl" in text and "gRPC" in text
        assert "workers: in the replica" in text  # one node: --colocate auto puts them there
        assert "sk-file" not in text
        assert "will not be applied" not in text  # serve.run's reconnect note, quietened (cluster/serve/run.py)
        body = {"prompt": [1, 5, 9, 5, 9], "max_tokens": 8, "temperature": 0}
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json=body,
                          headers={"Authorization": "Bearer sk-file"})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
        want = LLM(str(tiny_target)).generate({"prompt_token_ids": [1, 5, 9, 5, 9]}, SamplingParams(
            temperature=0, max_tokens=8))[0].outputs[0]
        assert resp.json()["choices"][0]["text"] == want.text
        assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body).status_code == 401
        for path in ("/docs", "/openapi.json"):  # the docs are behind the key too
            assert httpx.get(f"http://127.0.0.1:{port}{path}").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        assert listening_hosts({port, grpc_port}) == {"127.0.0.1"}  # loopback only, HTTP and gRPC alike
        from specray.client import Client

        with Client(f"127.0.0.1:{grpc_port}", api_key="sk-file", root_certificates=cert, server_name="localhost",
                    timeout=60) as c:  # gRPC over TLS
            assert c.generate([1, 5, 9, 5, 9], max_tokens=4, ignore_eos=True).usage.completion_tokens == 4
    finally:
        proc.send_signal(signal.SIGTERM)  # as Ctrl-C: a clean shutdown, not Ray's abort
        try:
            rest = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0 and "specray serve: shutting down" in rest and "SIGTERM received" not in rest


def listening_hosts(ports: set[int]) -> set[str]:
    import psutil

    return {c.laddr.ip.removeprefix("::ffff:") for c in psutil.net_connections(kind="tcp")  # v4 on a v6 socket
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports}
