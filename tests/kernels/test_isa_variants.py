"""The C kernels' narrower instruction sets on this machine: the AVX2 paths (built with
-mno-avx512f, which is what an AVX-512 machine would otherwise never run) and the scalar paths
(no AVX2/FMA either) pass the same tests against their torch references in a fresh process."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specray.kernels import cpu_kernels

TESTS = Path(__file__).parent
SUITES = ["test_cpu_ops.py", "test_quant_linear.py", "test_fast_linear.py", "test_decoder_layers.py",
          "test_hybrid_attention.py"]


@functools.cache
def predefined_macros(flags: str) -> frozenset[str]:
    """The compiler's predefined macros under the kernels' flags plus `flags`: what the sources'
    `#if defined(__AVX2__)`-style choices see (equal sets build the same paths)."""
    compiler = os.environ.get("CC", "cc")
    done = subprocess.run([compiler, *cpu_kernels.CFLAGS, *flags.split(), "-dM", "-E", "-x", "c", "/dev/null"],
                          capture_output=True, text=True, timeout=60, check=True)
    return frozenset(done.stdout.splitlines())


@pytest.mark.parametrize("flags", ["-mno-avx512f", "-mno-avx512f -mno-avx2 -mno-fma", "-mno-avx512vnni"])
def test_kernels_built_for_narrower_isas_match_their_references(flags, tmp_path):
    if not cpu_kernels.available():
        pytest.skip("no C compiler: the torch paths run everywhere")
    if predefined_macros(flags) == predefined_macros(""):  # e.g. -mno-avx512f on an AVX2 machine
        pytest.skip(f"{flags} turns off nothing this machine has: the suite's own kernel tests ran this build")
    env = {**os.environ, cpu_kernels.FLAGS_ENV: flags}
    check = subprocess.run([sys.executable, "-c", "from specray.kernels import cpu_kernels; "
                            "import sys; sys.exit(cpu_kernels.library() is None)"], env=env, timeout=300)
    assert check.returncode == 0, f"the kernels did not build with {flags}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
                          *[str(TESTS / s) for s in SUITES]], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout


FAST_OUTPUTS = """
import sys, torch
sys.path.insert(0, {tests!r})
from helpers import gguf_exact
from specray.kernels import fast_linear as fl, quant_linear as ql
torch.manual_seed(0)
outs = []
for kind in ("q4_1", "q8_0"):
    for blocks in (3, 18, 33):
        packed = ql.pack_exact(gguf_exact(torch.randn(21, 32 * blocks), kind))
        x = torch.randn(11, 32 * blocks)
        outs += [fl.fast_linear(x, fl.pack_fast(packed, parts)) for parts in (1, 2)]
torch.save(outs, {out!r})
"""


def test_the_fast_kernels_give_the_same_bits_on_every_isa(tmp_path):
    """One lane order everywhere (csrc/fast_linear.c): AVX-512 with and without VNNI, AVX2 and
    scalar builds give bit-identical projections, fast16's two-part sums too (attention sums in each build's lane order, so a
    model's logits still differ in their last bits between builds)."""
    if not cpu_kernels.available():
        pytest.skip("no C compiler")
    builds = {}  # one run per distinct build: flags that turn off nothing here build the native one
    for flags in ["", "-mno-avx512vnni", "-mno-avx512f", "-mno-avx512f -mno-avx2 -mno-fma"]:
        builds.setdefault(predefined_macros(flags), flags)
    if len(builds) < 2:
        pytest.skip("no flag here turns off an instruction set this machine has: one build only")
    results = []
    for i, flags in enumerate(builds.values()):
        out = tmp_path / f"{i}.pt"
        env = {**os.environ, cpu_kernels.FLAGS_ENV: flags}
        done = subprocess.run([sys.executable, "-c", FAST_OUTPUTS.format(tests=str(TESTS.parent), out=str(out))],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        results.append(torch.load(out))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
