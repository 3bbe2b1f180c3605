"""Run an ASGI app with uvicorn on a background thread: the replica's own HTTP server (`http.server:
replica`), tests and benchmarks. Its protocol bounds what uvicorn leaves open: a request head must
arrive whole within a deadline, and its size is capped (h11's incomplete-event limit)."""

from __future__ import annotations

import socket
import threading
import time


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


HEADER_TIMEOUT_S = 10.0  # a request head (line and headers) must arrive whole within this
MAX_HEADER_BYTES = 64 * 1024


def bounded_h11(header_timeout_s: float = HEADER_TIMEOUT_S):
    """uvicorn's h11 protocol with a deadline on every request head: a connection that has not sent
    one whole within `header_timeout_s` of opening, or of its previous response, is closed. uvicorn
    has none, so a client could hold a connection forever by sending headers slowly."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_deadline()

        def connection_lost(self, exc) -> None:
            self._head_deadline.cancel()
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            if getattr(self, "_head_deadline", None) is not None:
                self._head_deadline.cancel()
            self._head_deadline = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _head_too_slow(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()  # no whole request head in time (or idle: keep-alive ends it too)

    return BoundedH11Protocol


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None,
                 keep_alive_timeout_s: float = 5.0, header_timeout_s: float = HEADER_TIMEOUT_S):
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", http=bounded_h11(header_timeout_s),
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES, timeout_keep_alive=keep_alive_timeout_s)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="specray-http", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"HTTP server did not start on {self.url}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
