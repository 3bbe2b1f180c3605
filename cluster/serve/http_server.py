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
MAX_HEAD_BYTES = 2 * MAX_HEADER_BYTES  # the raw head, request line and separators included: the app's 431 is the exact one
HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                  b"connection: close\r\ncontent-length: 28\r\n\r\nrequest head is over 128 KiB")


class _HeadDeadline:
    """A deadline on every request head: a connection that has not sent one whole within the
    deadline of opening, or of its previous response, is closed. uvicorn has none, so a client could
    hold a connection forever by sending headers slowly. Mixed into uvicorn's HTTP protocols, which
    tell it `_head_arrived`."""

    header_timeout_s = HEADER_TIMEOUT_S

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
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _head_too_slow(self) -> None:
        if not self._head_arrived() and not self.transport.is_closing():
            self.transport.close()  # no whole request head in time (an idle keep-alive ends the same way)


def bounded_protocol(header_timeout_s: float = HEADER_TIMEOUT_S):
    """uvicorn's httptools protocol (a C parser) with the head deadline; its h11 one without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        class Bounded(_HeadDeadline, HttpToolsProtocol):
            def _arm_head_deadline(self) -> None:
                # a pipelined request whose head came during the last response runs now: arrived
                cycle = getattr(self, "cycle", None)
                self._head_done = cycle is not None and not cycle.response_complete
                super()._arm_head_deadline()

            def connection_made(self, transport) -> None:
                self._in_head, self._head_bytes = True, 0  # the parser reads a head until its end
                super().connection_made(transport)

            def data_received(self, data: bytes) -> None:
                """httptools buffers a head whole, whatever its size (the app's 431 came after 100 MB
                of it, in quadratic time): bytes fed while a head is read (the first one's, or a
                pipelined one's after a body) past MAX_HEAD_BYTES close the connection with a 431."""
                while data and self._in_head and not self.transport.is_closing():
                    room = MAX_HEAD_BYTES - self._head_bytes
                    if room <= 0:
                        cycle = getattr(self, "cycle", None)
                        if cycle is None or cycle.response_complete:  # not inside a pipelined one's response
                            self.transport.write(HEAD_TOO_LARGE)
                        self.transport.close()
                        return
                    piece, data = data[:room], data[room:]
                    self._head_bytes += len(piece)
                    super().data_received(piece)  # may end the head (and a body, and start the next head)
                if data and not self.transport.is_closing():
                    super().data_received(data)  # a body

            def on_headers_complete(self) -> None:
                self._head_done, self._in_head = True, False
                super().on_headers_complete()

            def on_message_complete(self) -> None:
                self._in_head, self._head_bytes = True, 0  # what follows is the next request's head
                super().on_message_complete()

            def _head_arrived(self) -> bool:
                return self._head_done
    except ImportError:  # httptools is optional in uvicorn
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class Bounded(_HeadDeadline, H11Protocol):
            def _head_arrived(self) -> bool:
                return self.conn.their_state is not h11.IDLE

    Bounded.header_timeout_s = header_timeout_s
    return Bounded


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None,
                 keep_alive_timeout_s: float = 5.0, header_timeout_s: float = HEADER_TIMEOUT_S):
        """Calls in flight are bounded by the app (middleware.CallLimit), not by uvicorn's
        limit_concurrency, which counts idle connections too."""
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", http=bounded_protocol(header_timeout_s),
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
