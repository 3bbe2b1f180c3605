"""`specray bench serve --url`: the server's root with or without `/v1`, OpenAI's and
llama-server's model listings, and clear errors where a server lists none."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from specray.cluster.bench.listing import api_root, first_model

LISTINGS = {
    "/openai/v1/models": (200, {"object": "list", "data": [{"id": "smollm2-135m", "object": "model"}]}),
    "/llama/v1/models": (200, {"models": [{"name": "smollm2.gguf", "model": "smollm2.gguf"}],
                               "object": "list", "data": []}),
    "/empty/v1/models": (200, {"object": "list", "data": []}),
    "/text/v1/models": (200, "not a listing"),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        status, body = LISTINGS.get(self.path, (404, {"error": {"message": "Not Found", "code": 404}}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_every_form_of_the_url_names_the_root(url):
    assert api_root(url) == "http://h:8000"


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_openai_and_llama_server_listings(server, suffix):
    assert first_model(httpx, f"{server}/openai{suffix}", {}) == "smollm2-135m"
    assert first_model(httpx, f"{server}/llama{suffix}", {}) == "smollm2.gguf"


@pytest.mark.parametrize("path,match", [("/missing", r"HTTP 404: .*Not Found.*pass --model"),
                                        ("/empty", "lists no models"),
                                        ("/text", "not a model listing")])
def test_a_server_without_models_is_a_clear_error(server, path, match):
    with pytest.raises(ValueError, match=match):
        first_model(httpx, server + path, {})


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(ValueError, match=r"cannot list models at http://127.0.0.1:9/v1/models"):
        first_model(httpx, "http://127.0.0.1:9", {})
