"""`specray bench serve --against-llama-server`: the pieces that run without a llama.cpp build
(finding the build and the GGUF, the command lines, the comparison table, a server that fails to
start). The measurement itself is a benchmark (docs/performance.md), never a test."""

import sys

import pytest

from specray.cluster.bench.side_by_side import (Server, compare, find_llama_server, gguf_of, llama_server_command,
                                                markdown, specray_command)


def level(c, tokens_per_s, ttft, errors=0, itl=0.02):
    return {"concurrency": c, "throughput_tokens_per_s": tokens_per_s, "errors": errors,
            "ttft_s": {"p50": ttft}, "tpot_s": {"p50": 0.01}, "itl_s": {"p99": itl}, "e2e_s": {"p50": 1.0}}


def test_no_build_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="build one with `bash scripts/build_llama_cpp.sh`"):
        find_llama_server(None)
    with pytest.raises(ValueError, match="no llama-server executable"):
        find_llama_server(str(tmp_path))
    build = tmp_path / "llama.cpp" / "1.0" / "bin"
    build.mkdir(parents=True)
    (build / "llama-server").write_text("#!/bin/sh\n")
    (build / "llama-server").chmod(0o755)
    assert find_llama_server(None) == build / "llama-server" == find_llama_server(str(build))


def test_both_servers_load_the_same_gguf(tmp_path):
    assert gguf_of("smollm2-135m").name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(ValueError, match="needs a GGUF model"):
        gguf_of(str(tmp_path))
    cmd = llama_server_command(tmp_path / "llama-server", gguf_of("smollm2-135m"), 8080, 2, 8, 16384)
    assert cmd[cmd.index("-t") + 1] == "2" and cmd[cmd.index("-np") + 1] == "8" and cmd[cmd.index("-c") + 1] == "16384"
    spec = llama_server_command(tmp_path / "llama-server", gguf_of("smollm2-135m"), 8080, 2, 8, 16384,
                                "--spec-type ngram-map-k --spec-draft-n-max '4'")
    assert spec == cmd + ["--spec-type", "ngram-map-k", "--spec-draft-n-max", "4"]
    serve = specray_command("smollm2-135m", 8000, 9000, "--colocate off --max-num-seqs 16")
    assert serve[-5:] == ["--no-enable-prefix-caching", "--colocate", "off", "--max-num-seqs", "16"] and "--port" in serve
    # the levels repeat the prompts: no cache answers them, unless the flags ask for one
    assert "--no-enable-prefix-caching" not in specray_command("m", 1, 2, "--enable-prefix-caching")


def test_the_comparison_pairs_levels():
    rows = compare({"llama-server": [level(1, 50.0, 0.2), level(8, 100.0, 0.1)],
                    "specray": [level(1, 60.0, 0.3), level(8, 150.0, 0.2, errors=1, itl=0.5)]})
    assert [r["ratio"] for r in rows] == [1.2, 1.5] and rows[1]["errors"] == [0, 1]
    table = markdown({"model": "m", "gguf": "m.gguf", "endpoint": "chat", "num_requests": 4, "max_tokens": 8,
                      "temperature": 0.0, "ignore_eos": True, "llama_command": ["llama-server", "-t", "2"],
                      "specray_args": "", "comparison": rows})
    assert "| 8 | 100.0 | 150.0 | 1.5x | 0.1 / 0.2 | 0.01 / 0.01 | 0.02 / 0.5 | 0 / 1 |" in table
    assert "prompts: the packaged Spec-Bench subset" in table  # no dataset: the report says so


def test_a_server_that_exits_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 3"):
        with Server("broken", [sys.executable, "-c", "import sys; sys.exit(3)"], "http://127.0.0.1:9",
                    tmp_path / "log"):
            pass


FAKE_SERVER = """
import http.server, sys
body = sys.argv[2].encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body if self.path == "/v1/models" else b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.parametrize("listing, up", [('{"data": [{"id": "m"}]}', True), ("<html>ok</html>", False)])
def test_a_server_is_up_only_once_it_lists_a_model(tmp_path, listing, up):
    """Another process on the picked port (a /health of 200, no model listing) is not taken for the
    server: the bench waits for the server's own answer, and says so if it never comes."""
    from specray.cluster.serve.http_server import free_port

    port = free_port()
    command = [sys.executable, "-c", FAKE_SERVER, str(port), listing]
    server = Server("fake", command, f"http://127.0.0.1:{port}", tmp_path / "log", timeout_s=8)
    if up:
        with server:
            pass
    else:
        with pytest.raises(RuntimeError, match="did not become healthy"):
            with server:
                pass


def test_extra_server_flags_parse_in_both_forms():
    """A value of several flags after a space, a lone flag after `=` (argparse reads a lone "--x" as an option)."""
    from specray.cluster.cli import build_parser

    args = build_parser().parse_args(["bench", "serve", "--against-llama-server", "--llama-args",
                                      "--spec-type ngram-map-k", "--specray-args=--no-enable-prefix-caching"])
    assert (args.llama_args, args.specray_args) == ("--spec-type ngram-map-k", "--no-enable-prefix-caching")
