"""The replica's HTTP server closes a connection whose request head does not arrive in time, and
only such a connection: a request pipelined behind another (its head sent with the first) runs to
its end however long it takes."""

import asyncio
import socket
import time

from specray.cluster.serve.http_server import BackgroundServer

DEADLINE_S = 0.5


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(3 * DEADLINE_S)
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def exchange(url: str, payload: bytes, seconds: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=seconds) as conn:
        conn.sendall(payload)
        got, end = b"", time.monotonic() + seconds
        while time.monotonic() < end:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def test_a_pipelined_request_outlives_the_head_deadline():
    with BackgroundServer(app, header_timeout_s=DEADLINE_S) as server:
        got = exchange(server.url, request("/fast") + request("/slow"))
    assert got.count(b"HTTP/1.1 200") == 2 and got.endswith(b"/slow"), got


def test_a_connection_without_a_whole_head_is_closed_at_the_deadline():
    with BackgroundServer(app, header_timeout_s=DEADLINE_S) as server:
        start = time.monotonic()
        got = exchange(server.url, b"GET /fast HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        assert got == b"" and time.monotonic() - start < 4 * DEADLINE_S
        got = exchange(server.url, request("/fast"), seconds=3 * DEADLINE_S)  # then idle: closed as well
        assert got.count(b"HTTP/1.1 200") == 1 and got.endswith(b"/fast"), got


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_frees_its_call():
    """A client sending a byte a minute held one of the calls in flight for good (560 of them: every
    later call a 503); the body now has a deadline from its head. A body in time, and the wait for a
    disconnect after it (a stream's), are not cut."""
    from fastapi import FastAPI, Request

    from specray.cluster.serve.middleware import RequestLimits

    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        body = await request.body()
        await asyncio.sleep(2 * DEADLINE_S)  # past the deadline once the body is in: still answered
        return {"bytes": len(body), "gone": await request.is_disconnected()}

    app.add_middleware(RequestLimits, max_bytes=1000, reject=None, body_timeout_s=DEADLINE_S)
    with BackgroundServer(app, header_timeout_s=DEADLINE_S) as server:  # an idle connection closes after it
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        start = time.monotonic()
        got = exchange(server.url, head + b"{" * 10, seconds=4 * DEADLINE_S)  # 90 bytes never come
        assert got.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 3 * DEADLINE_S, got
        got = exchange(server.url, head + b"1" * 100, seconds=5 * DEADLINE_S)
        assert got.startswith(b"HTTP/1.1 200") and b'"bytes":100' in got, got


def test_a_head_past_its_bytes_is_cut_off_before_it_ends():
    """httptools buffered a head whole (100 MB, quadratic time on the event loop) before the app's
    431: past 128 KiB of head the connection gets a 431 and closes; a body after a small head is
    not counted as head."""
    from fastapi import FastAPI, Request

    from specray.cluster.serve.http_server import MAX_HEAD_BYTES

    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return {"bytes": len(await request.body())}

    with BackgroundServer(app, header_timeout_s=DEADLINE_S) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent, answer = 0, b""
            try:
                while sent < 10 * MAX_HEAD_BYTES:
                    conn.sendall(b"a" * 65536)
                    sent += 65536
            except OSError:  # closed on us: the 431 is waiting
                pass
            answer = conn.recv(1024)
        assert answer.startswith(b"HTTP/1.1 431"), (sent, answer)  # the head never ended: before, the deadline's b""
        body = b"1" * (3 * MAX_HEAD_BYTES)  # one send with its head: only the head counts
        head = f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        got = exchange(server.url, head + body, seconds=5 * DEADLINE_S)
        assert got.startswith(b"HTTP/1.1 200") and f'"bytes":{len(body)}'.encode() in got, got


def test_a_pipelined_head_past_its_bytes_is_cut_off_too():
    """A huge head pipelined behind a slow request was fed to the parser unchecked while the first
    response ran (until the head deadline, 10 s by default): the connection now closes once its
    bytes pass the bound."""
    from specray.cluster.serve.http_server import MAX_HEAD_BYTES

    with BackgroundServer(app, header_timeout_s=20 * DEADLINE_S) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30 * DEADLINE_S) as conn:
            start = time.monotonic()
            conn.sendall(request("/slow") + b"GET /fast HTTP/1.1\r\nHost: x\r\nX-Big: ")
            try:
                for _ in range(4 * MAX_HEAD_BYTES // 65536):
                    conn.sendall(b"a" * 65536)
                while conn.recv(65536):
                    pass
            except OSError:  # reset on us
                pass
            elapsed = time.monotonic() - start
    assert elapsed < 10 * DEADLINE_S, elapsed  # not the head deadline's 20 x
