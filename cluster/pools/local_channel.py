"""Same-node calls to a pool worker over a Unix socket, instead of a Ray actor call a round.

On a busy 2-core node a Ray actor call costs 1.5-3.5 ms beyond the work it carries, a quarter of a
batch-1 round; a message on a Unix socket costs tens of microseconds (docs/performance.md). The
worker's host actor listens on an abstract Unix socket (Linux: no file to clean up) guarded by an
auth key it hands out over Ray, and answers calls in the order they arrive. Ray stays the control
plane: it places, starts, restarts and kills the workers, and carries every call where the router
and the worker are on different nodes.

A call's reply carries its ticket, so a reply nobody waits for any more (a timed-out proposal) is
dropped instead of answering the next call. The worker's exception comes back as WorkerError; a
worker that went away as ChannelClosed.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import sys
import threading
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener

import torch


class WorkerError(RuntimeError):
    """The worker raised while answering a call; the message holds its traceback."""


class ChannelClosed(ConnectionError):
    """The worker's end of the channel went away (the worker died or is restarting)."""


def _tensor(data: bytes, dtype: torch.dtype, shape: tuple, device: str) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out = flat.view(dtype).reshape(shape)
    return out if device == "cpu" else out.to(device)


def _reduce_tensor(t: torch.Tensor):
    """A tensor as its raw bytes: torch's own pickling goes through torch.save per storage, 10x
    slower on a round's results (docs/performance.md)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return _tensor, (flat.numpy().tobytes(), t.dtype, tuple(t.shape), str(t.device))


_DISPATCH = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(obj)
    return buffer.getvalue()


def supported() -> bool:
    """Abstract Unix sockets are Linux's."""
    return sys.platform.startswith("linux")


def _traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))


class ChannelServer:
    """The worker's end: each connection's calls are read in order and handed to `call`, on a
    thread of the connection's own, or (`watch`) by whoever `watch(conn, answer_one)` hands it to:
    a worker host gives it to the compute thread, which then reads, runs and answers each call
    itself."""

    def __init__(self, call, watch=None):
        self.call, self.watch = call, watch
        self.authkey = os.urandom(32)
        self.address = f"\0specray-{os.getpid()}-{os.urandom(6).hex()}"
        self.listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        threading.Thread(target=self._accept, name="specray-channel", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except (AuthenticationError, EOFError, OSError):  # a client that failed the handshake
                continue
            if self.watch is not None:
                self.watch(conn, self.answer_one)
            else:
                threading.Thread(target=self._answer, args=(conn,), name="specray-channel-conn", daemon=True).start()

    def _answer(self, conn: Connection) -> None:
        with conn:
            while self.answer_one(conn):
                pass

    def answer_one(self, conn: Connection) -> bool:
        """Read one call, run it, answer it; False once the client left (the caller closes it)."""
        try:
            ticket, method, args, reply = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return False
        ok, value = self._run(method, args)
        return not reply or self._reply(conn, ticket, ok, value)

    @staticmethod
    def _reply(conn: Connection, ticket: int, ok: bool, value) -> bool:
        """Send a reply (a result that cannot be pickled fails its call); False once the client left."""
        try:
            data = dumps((ticket, ok, value))
        except Exception as e:  # noqa: BLE001
            data = dumps((ticket, False, _traceback(e)))
        try:
            conn.send_bytes(data)
        except OSError:
            return False
        return True

    def _run(self, method: str, args: tuple) -> tuple[bool, object]:
        try:
            return True, self.call(method, *args)
        except Exception as e:  # noqa: BLE001 - the caller decides what a failed call means
            return False, _traceback(e)


class Channel:
    """The router's end: `send` a call now, `receive` its reply later (in any order of tickets)."""

    def __init__(self, address: str, authkey: bytes):
        self.conn = Client(address, family="AF_UNIX", authkey=authkey)
        self.send_lock, self.receive_lock = threading.Lock(), threading.Lock()
        self.next_ticket = 0
        self.replies: dict[int, tuple[bool, object]] = {}  # arrived before their receiver asked
        self.abandoned: set[int] = set()

    def send(self, method: str, *args, reply: bool = True) -> int:
        with self.send_lock:
            ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
            try:
                self.conn.send_bytes(dumps((ticket, method, args, reply)))
            except OSError as e:
                raise ChannelClosed(f"the worker's channel is closed ({e})") from None
            return ticket

    def receive(self, ticket: int, timeout_s: float | None = None):
        with self.receive_lock:
            while ticket not in self.replies:
                self._read_one(ticket, timeout_s)
            ok, value = self.replies.pop(ticket)
        if not ok:
            raise WorkerError(f"the worker raised:\n{value}")
        return value

    def _read_one(self, ticket: int, timeout_s: float | None) -> None:
        try:
            answered = timeout_s is None or self.conn.poll(timeout_s)
            if answered:
                got, ok, value = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as e:
            raise ChannelClosed(f"the worker's channel is closed ({type(e).__name__})") from None
        if not answered:
            self.abandoned.add(ticket)
            raise TimeoutError(f"no answer within {timeout_s}s")
        if got in self.abandoned:
            self.abandoned.discard(got)
        else:
            self.replies[got] = (ok, value)

    def call(self, method: str, *args, timeout_s: float | None = None):
        return self.receive(self.send(method, *args), timeout_s)

    def close(self) -> None:
        self.conn.close()


class ChannelPending:
    """One call's reply; failures become what the pool says they mean (as Ray failures do)."""

    def __init__(self, channel: Channel, ticket: int, on_failure, timeout_s: float | None = None, on_result=None):
        self.channel, self.ticket, self.on_failure = channel, ticket, on_failure
        self.timeout_s, self.on_result = timeout_s, on_result

    def result(self):
        try:
            value = self.channel.receive(self.ticket, self.timeout_s)
        except (ChannelClosed, TimeoutError) as e:
            raise self.on_failure(e) from None
        return value if self.on_result is None else self.on_result(value)
