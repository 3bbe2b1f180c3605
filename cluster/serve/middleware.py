"""Plain ASGI middlewares of the HTTP API: the request size limits, the API key check and the limit
on calls in flight.

RequestLimits refuses headers over a size limit (431) and bodies over theirs (413) before the app
buffers and parses them: a body by its declared Content-Length at once, and by counting as a chunked
body arrives; and a body that does not arrive whole within its deadline (408): a client sending a
byte a minute held one of the calls in flight for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestLimits:
    def __init__(self, app: ASGIApp, max_bytes: int, reject: Callable[[str], object],
                 max_header_bytes: int | None = None, reject_headers: Callable[[str], object] | None = None,
                 body_timeout_s: float | None = None):
        assert max_bytes >= 1
        self.app, self.max_bytes, self.reject = app, max_bytes, reject
        self.max_header_bytes, self.reject_headers = max_header_bytes, reject_headers
        self.body_timeout_s = body_timeout_s

    def _message(self) -> str:
        return f"request body is larger than {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.max_header_bytes is not None:
            size = sum(len(k) + len(v) for k, v in scope["headers"])
            if size > self.max_header_bytes:
                await self.reject_headers(f"request headers are larger than {self.max_header_bytes} bytes")(
                    scope, receive, send)
                return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self.reject(self._message())(scope, receive, send)
            return
        received, body_done = 0, False
        loop = asyncio.get_running_loop()
        deadline = None if self.body_timeout_s is None else loop.time() + self.body_timeout_s

        async def counted() -> Message:
            nonlocal received, body_done
            if body_done or deadline is None:  # after the body: a wait for the client's disconnect
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:  # the app's exception handlers answer it
                    raise HTTPException(408, f"the request body did not arrive within {self.body_timeout_s:g} s") \
                        from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_bytes:  # the app's exception handlers answer it
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)


class KeyGuard:
    """Refuses requests `allowed(path, authorization header)` rejects, before any route runs."""

    def __init__(self, app: ASGIApp, allowed: Callable[[str, bytes | None], bool], reject: Callable[[], object]):
        self.app, self.allowed, self.reject = app, allowed, reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allowed(scope["path"], dict(scope["headers"]).get(b"authorization")):
            await self.reject()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class CallLimit:
    """Refuses a call past `max_calls` in flight (its streaming included) with `reject()`, except on
    `exempt` paths (health checks, metrics): uvicorn's own limit counts open connections, so idle
    sockets made /health answer 503."""

    def __init__(self, app: ASGIApp, max_calls: int, exempt: tuple[str, ...], reject: Callable[[], object]):
        assert max_calls >= 1
        self.app, self.max_calls, self.exempt, self.reject = app, max_calls, exempt, reject
        self.in_flight = 0  # one event loop: no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_calls:
            await self.reject()(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
