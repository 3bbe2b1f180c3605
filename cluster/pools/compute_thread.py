"""The one thread that builds and runs a process's workers (a Ray worker host, or the Serve replica
with `pools.colocate` or the inline draft), and in the replica also the router's rounds
(cluster/router/async_router.py): a round's calls to in-process workers then run directly, with no
thread hand-off each way.

Both torch's thread count and the OpenMP team belong to the calling thread: a worker built on one
thread (where `torch.set_num_threads` ran) and stepped on another computes with Ray's
OMP_NUM_THREADS instead, and a second thread that computes starts a second OpenMP team, after which
libgomp sleeps between parallel regions instead of spinning (more threads than cores): either one
halved a decode step (docs/performance.md). So every call goes to this thread; the caller waits.

The thread also reads the same-node channels (cluster/pools/local_channel.py) itself: a call that
arrives on a socket runs and is answered here, without waking a socket thread that would then wake
this one and wait for it (two thread hand-offs each way on a busy node).
"""

from __future__ import annotations

import collections
import os
import selectors
import threading
from concurrent.futures import Future

_LOCK = threading.Lock()
_LOOP: _ComputeLoop | None = None
_HERE = threading.local()  # .compute is True on the compute thread only


class _ComputeLoop:
    """A thread that runs submitted calls and serves watched connections, one thing at a time."""

    def __init__(self):
        self.tasks: collections.deque = collections.deque()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        threading.Thread(target=self._run, name="specray-compute", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self.tasks.append((future, fn, args))
        os.write(self.wake_write, b"\0")
        return future

    def _run(self) -> None:
        _HERE.compute = True
        while True:
            for key, _ in self.selector.select():
                if key.fileobj == self.wake_read:
                    self._run_tasks()
                elif not self._serve(key):
                    self.selector.unregister(key.fd)
                    key.fileobj.close()

    @staticmethod
    def _serve(key) -> bool:
        """One turn of a watched connection's handler; False once it ended or broke (it is then
        closed, as a dead worker's would be, and the thread goes on serving the rest)."""
        try:
            return key.data(key.fileobj)
        except Exception:  # noqa: BLE001 - e.g. a message that does not unpickle
            return False

    def _run_tasks(self) -> None:
        """The tasks queued by now; those they queue run after the watched connections' turn."""
        try:
            os.read(self.wake_read, 4096)
        except BlockingIOError:
            pass
        for _ in range(len(self.tasks)):
            future, fn, args = self.tasks.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the caller re-raises it
                future.set_exception(e)

    def watch(self, conn, handle) -> None:
        """Call `handle(conn)` on this thread whenever `conn` is readable, until it returns False."""
        run(self.selector.register, conn, selectors.EVENT_READ, handle)

    def waiting(self) -> bool:
        """A queued call or a readable connection (asked on this thread, between two of its own calls)."""
        return bool(self.tasks) or bool(self.selector.select(0))


def _loop() -> _ComputeLoop:
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = _ComputeLoop()
        return _LOOP


def run(fn, *args):
    """fn(*args) on the compute thread (directly when already on it)."""
    if getattr(_HERE, "compute", False):
        return fn(*args)
    return _loop().submit(fn, *args).result()


def post(fn, *args) -> Future:
    """Queue fn(*args) on the compute thread and return at once, also from the compute thread itself
    (it runs after what is queued before it)."""
    return _loop().submit(fn, *args)


def waiting() -> bool:
    """Whether anything else waits for the compute thread: a call running there may then go on
    (the router's next round) instead of queueing itself behind a wake-up of the thread."""
    return _loop().waiting()


def watch(conn, handle) -> None:
    """Serve `conn` on the compute thread: `handle(conn)` runs there whenever it is readable."""
    _loop().watch(conn, handle)


class OnComputeThread:
    """A worker built by `build(spec)` on the compute thread; its methods run there too."""

    def __init__(self, build, spec):
        self.worker = run(build, spec)

    def __getattr__(self, name: str):
        method = getattr(self.worker, name)
        if not callable(method):
            return method
        return lambda *args: run(method, *args)
