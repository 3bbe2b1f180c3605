"""The C kernels' parallel loops (csrc/pool.c): every iteration runs exactly once on either of its
two runners (the kernels' own threads, or torch's OpenMP team), from concurrent callers and after a
fork, and the kernels' outputs never depend on which runner or how many threads computed them."""

import os
import subprocess
import sys
import threading

import pytest
import torch

from specray.kernels import cpu_kernels
from specray.kernels import fast_linear as fl
from specray.kernels import quant_linear as ql

from helpers import gguf_exact

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")


@pytest.fixture(params=[1, 0], ids=["own-threads", "openmp"])
def runner(request):
    lib = cpu_kernels.library()
    lib.specray_use_pool(request.param)
    yield lib
    lib.specray_use_pool(int(cpu_kernels.use_pool()))


def ran(lib, n: int, chunk: int, threads: int) -> torch.Tensor:
    """Per iteration: how often it ran (low byte) and by which thread (the rest)."""
    seen = torch.zeros(n, dtype=torch.int32)
    lib.specray_parallel_check(n, chunk, threads, seen.data_ptr())
    return seen


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n, chunk", [(1, 1), (5, 1), (100, 3), (1000, 64), (70000, 1)])
def test_every_iteration_runs_once(runner, n, chunk, threads):
    for _ in range(20):
        seen = ran(runner, n, chunk, threads)
        assert torch.equal(seen & 0xFF, torch.ones(n, dtype=torch.int32))
        assert int((seen >> 8).max()) < threads


def test_a_negative_control_would_be_seen(runner):
    """The check above can fail: marking a range twice shows up in the low byte."""
    seen = ran(runner, 50, 4, 2)
    runner.specray_parallel_check(10, 1, 2, seen.data_ptr())
    assert (seen[:10] & 0xFF).eq(2).all() and (seen[10:] & 0xFF).eq(1).all()


def test_concurrent_callers_each_run_their_loop(runner):
    """A second caller while a loop runs does its loop alone; none is lost or run twice."""
    failures = []

    def call():
        for _ in range(200):
            seen = ran(runner, 3000, 16, 2)
            if not torch.equal(seen & 0xFF, torch.ones(3000, dtype=torch.int32)):
                failures.append(seen)

    callers = [threading.Thread(target=call) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not failures


FORK = """
import os, sys, torch
from specray.kernels import cpu_kernels
lib = cpu_kernels.library()
lib.specray_use_pool(1)
seen = torch.zeros(5000, dtype=torch.int32)
lib.specray_parallel_check(5000, 8, 2, seen.data_ptr())  # the parent's workers exist now
pid = os.fork()
if pid == 0:
    seen = torch.zeros(5000, dtype=torch.int32)
    lib.specray_parallel_check(5000, 8, 2, seen.data_ptr())  # the child starts its own
    os._exit(0 if bool(((seen & 0xFF) == 1).all()) else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_loops():
    done = subprocess.run([sys.executable, "-c", FORK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_kernels_give_the_same_bits_on_either_runner_and_any_thread_count(kind):
    torch.manual_seed(0)
    packed = ql.pack_exact(gguf_exact(torch.randn(301, 32 * 18), kind))
    fast = fl.pack_fast(packed)
    x = torch.randn(11, packed.in_features)
    lib, threads = cpu_kernels.library(), torch.get_num_threads()
    outputs = []
    try:
        for pool in (1, 0):
            lib.specray_use_pool(pool)
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                outputs.append((ql.packed_linear(x, packed), fl.fast_linear(x, fast)))
    finally:
        torch.set_num_threads(threads)
        lib.specray_use_pool(int(cpu_kernels.use_pool()))
    for exact, fast_out in outputs[1:]:
        assert torch.equal(exact, outputs[0][0]) and torch.equal(fast_out, outputs[0][1])


def test_the_product_runs_the_kernels_own_threads():
    """`import specray` before torch makes torch's threads stop spinning soon after its ops, so the
    kernels use their own; with torch imported first (its threads spin for long) torch's team."""
    probe = ("import {first}, {second}; from specray.kernels import cpu_kernels; "
             "print(cpu_kernels.use_pool())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", cpu_kernels.POOL_ENV)}
    for first, second, want in [("specray", "torch", "True"), ("torch", "specray", "False")]:
        out = subprocess.run([sys.executable, "-c", probe.format(first=first, second=second)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr[-2000:]

