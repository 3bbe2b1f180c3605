"""What one gRPC connection may hold of the replica's server, seen from raw HTTP/2 frames: its
streams are bounded, an idle connection is closed, and a peer with a call open that stops answering
pings (its machine gone) is closed, while one that answers keeps its connection."""

import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from specray.cluster.serve.grpc_server import GrpcLimits, GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService

SETTINGS, PING, GOAWAY, HEADERS = 4, 6, 7, 1
ACK, END_HEADERS = 1, 4
MAX_CONCURRENT_STREAMS = 3  # the SETTINGS parameter's id


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK header field without indexing, name and value as plain strings (< 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


class Peer:
    """A client speaking HTTP/2 by hand: it answers pings only when told to."""

    def __init__(self, port: int, answer_pings: bool):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.answer_pings, self.buffer, self.settings = answer_pings, b"", {}
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(SETTINGS, 0, 0))

    def open_call(self) -> None:
        """A Generate call whose request message never comes."""
        block = b"".join(_literal(k, v) for k, v in [
            (":method", "POST"), (":scheme", "http"), (":path", "/specray.v1.Generation/Generate"),
            (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")])
        self.sock.sendall(_frame(HEADERS, END_HEADERS, 1, block))

    def read_for(self, seconds: float) -> str:
        """Frames for up to `seconds` -> "goaway", "closed" or "open" (neither came)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                kind, flags, payload = self._next()
            except TimeoutError:
                break
            except (ConnectionError, EOFError):
                return "closed"
            if kind == GOAWAY:
                return "goaway"
            if kind == SETTINGS and not flags & ACK:
                self.settings.update(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
                self.sock.sendall(_frame(SETTINGS, ACK, 0))
            if kind == PING and not flags & ACK and self.answer_pings:
                self.sock.sendall(_frame(PING, ACK, 0, payload))
        return "open"

    def _next(self) -> tuple[int, int, bytes]:
        while len(self.buffer) < 9 or len(self.buffer) < 9 + int.from_bytes(self.buffer[:3], "big"):
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buffer += data
        size = int.from_bytes(self.buffer[:3], "big")
        kind, flags, payload = self.buffer[3], self.buffer[4], self.buffer[9:9 + size]
        self.buffer = self.buffer[9 + size:]
        return kind, flags, payload


@pytest.fixture(scope="module")
def server():
    # an answer to a ping may take a busy 2-core box a while: the timeout leaves it 2 s
    limits = GrpcLimits(max_concurrent_streams=7, keepalive_time_s=0.5, keepalive_timeout_s=2.0, idle_timeout_s=1.0)
    with GrpcServerThread(GenerationService(None, None, "m"), limits=limits) as s:
        yield s


def test_streams_are_bounded_and_an_idle_connection_is_closed(server):
    peer = Peer(server.port, answer_pings=True)
    assert peer.read_for(10) in ("goaway", "closed")  # no call for idle_timeout_s
    assert peer.settings[MAX_CONCURRENT_STREAMS] == 7


def test_a_peer_that_stops_answering_pings_is_closed(server):
    alive, gone = Peer(server.port, answer_pings=True), Peer(server.port, answer_pings=False)
    alive.open_call()
    gone.open_call()
    with ThreadPoolExecutor(1) as pool:  # the live peer answers its pings meanwhile
        alive_state = pool.submit(alive.read_for, 6)
        assert gone.read_for(10) in ("goaway", "closed")
        assert alive_state.result() == "open"  # a call open, pings answered: neither idle nor dead
