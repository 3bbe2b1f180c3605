"""The C kernels' parallel loops (csrc/parallel.c): every iteration runs exactly once whatever the
thread count, chunk size or number of concurrent callers, and the kernels' outputs never depend on
which thread computed what or on how many threads there were."""

import threading

import pytest
import torch

from specray.kernels import cpu_kernels
from specray.kernels import fast_linear as fl
from specray.kernels import quant_linear as ql

from helpers import gguf_exact

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")


def ran(n: int, chunk: int, threads: int) -> torch.Tensor:
    """Per iteration: how often it ran (low byte) and by which thread (the rest)."""
    seen = torch.zeros(n, dtype=torch.int32)
    cpu_kernels.library().specray_parallel_check(n, chunk, threads, seen.data_ptr())
    return seen


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n, chunk", [(1, 1), (5, 1), (7, 3), (100, 3), (1000, 64), (70000, 1)])
def test_every_iteration_runs_once(n, chunk, threads):
    for _ in range(20):
        seen = ran(n, chunk, threads)
        assert torch.equal(seen & 0xFF, torch.ones(n, dtype=torch.int32))
        assert int((seen >> 8).max()) < threads


def test_a_negative_control_would_be_seen():
    """The check above can fail: running a range twice shows in the low byte."""
    seen = ran(50, 4, 2)
    cpu_kernels.library().specray_parallel_check(10, 1, 2, seen.data_ptr())
    assert (seen[:10] & 0xFF).eq(2).all() and (seen[10:] & 0xFF).eq(1).all()


def test_concurrent_callers_each_run_their_loop():
    failures = []

    def call():
        for _ in range(100):
            seen = ran(3000, 16, 2)
            if not torch.equal(seen & 0xFF, torch.ones(3000, dtype=torch.int32)):
                failures.append(seen)

    callers = [threading.Thread(target=call) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not failures


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_kernels_give_the_same_bits_on_any_thread_count(kind):
    torch.manual_seed(0)
    packed = ql.pack_exact(gguf_exact(torch.randn(301, 32 * 18), kind))
    fast = fl.pack_fast(packed)
    x = torch.randn(11, packed.in_features)
    threads = torch.get_num_threads()
    outputs = []
    try:
        for n in (1, 2, 3, 5):
            torch.set_num_threads(n)
            outputs.append((ql.packed_linear(x, packed), fl.fast_linear(x, fast)))
    finally:
        torch.set_num_threads(threads)
    for exact, fast_out in outputs[1:]:
        assert torch.equal(exact, outputs[0][0]) and torch.equal(fast_out, outputs[0][1])
