"""The one thread that builds and runs a process's workers (a Ray worker host, or the Serve replica
with `pools.colocate` or the inline draft).

Both torch's thread count and the OpenMP team belong to the calling thread: a worker built on one
thread (where `torch.set_num_threads` ran) and stepped on another computes with Ray's
OMP_NUM_THREADS instead, and a second thread that computes starts a second OpenMP team, after which
libgomp sleeps between parallel regions instead of spinning (more threads than cores): either one
halved a decode step (docs/performance.md). So every call goes to this thread; the caller waits.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_LOCK = threading.Lock()
_EXECUTOR: ThreadPoolExecutor | None = None
_HERE = threading.local()  # .compute is True on the compute thread only


def _mark() -> None:
    _HERE.compute = True


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="specray-compute",
                                           initializer=_mark)
        return _EXECUTOR


def run(fn, *args):
    """fn(*args) on the compute thread (directly when already on it)."""
    if getattr(_HERE, "compute", False):
        return fn(*args)
    return _executor().submit(fn, *args).result()


class OnComputeThread:
    """A worker built by `build(spec)` on the compute thread; its methods run there too."""

    def __init__(self, build, spec):
        self.worker = run(build, spec)

    def __getattr__(self, name: str):
        method = getattr(self.worker, name)
        if not callable(method):
            return method
        return lambda *args: run(method, *args)
