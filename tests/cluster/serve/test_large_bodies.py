"""A large request body is parsed and validated off the event loop every stream shares, and is
refused in the same words as a small one; a small one stays on the loop (no thread hop)."""

import threading

import httpx
import pytest

from specray.cluster.serve import openai_body

from openai_helpers import KEY, served  # noqa: F401 - the fixture

PAD = "x" * (openai_body.OFF_LOOP_BYTES + 1000)  # an ignored field's text makes a body large
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture()
def parse_threads(monkeypatch):
    threads = []
    parse = openai_body.parse_body

    def recording(*args):
        threads.append(threading.current_thread().name)
        return parse(*args)
    monkeypatch.setattr(openai_body, "parse_body", recording)
    return threads


def _post(url: str, body: bytes, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(url + "/v1/completions", content=body, headers={**HEADERS, "Content-Type": content_type},
                      timeout=60)


def test_a_large_body_is_parsed_off_the_loop(served, parse_threads):  # noqa: F811
    url = served[0].url
    small = _post(url, b'{"prompt": "w5", "max_tokens": 2, "temperature": 0}')
    large = _post(url, b'{"prompt": "w5", "max_tokens": 2, "temperature": 0, "user": "%s"}' % PAD.encode())
    assert small.status_code == large.status_code == 200
    assert small.json()["choices"][0]["text"] == large.json()["choices"][0]["text"]
    assert parse_threads[0] == "specray-http" != parse_threads[1]


FIELD, ITEM = b', "user": "%s"', b', "%s"'  # padding in an object, in a list


@pytest.mark.parametrize("body, pad, content_type, word", [
    (b'{"prompt": "w5", "max_tokens": true%s}', FIELD, "application/json", "max_tokens"),
    (b'{"prompt": [5, "w"]%s}', FIELD, "application/json", "prompt"),
    (b'{"prompt": "w5"%s', FIELD, "application/json", "JSON"),
    (b'{"prompt": "w5"%s}', FIELD, "text/plain", "JSON object"),
    (b'["w5"%s]', ITEM, "application/json", "JSON object"),
])
def test_a_large_body_is_refused_as_a_small_one(served, parse_threads, body, pad, content_type, word):  # noqa: F811
    url = served[0].url
    small = _post(url, body % b"", content_type)
    large = _post(url, body % (pad % PAD.encode()), content_type)
    assert small.status_code == large.status_code == 400
    if word != "JSON":  # a JSON error names its character offset, which the padding moves
        assert small.json() == large.json()
    assert word in large.json()["error"]["message"] or word == large.json()["error"]["param"]
    assert parse_threads[0] == "specray-http" != parse_threads[1]
