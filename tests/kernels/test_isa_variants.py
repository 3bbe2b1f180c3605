"""The C kernels' narrower instruction sets on this machine: the AVX2 paths (built with
-mno-avx512f, which is what an AVX-512 machine would otherwise never run) and the scalar paths
(no AVX2/FMA either) pass the same tests against their torch references in a fresh process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specray.kernels import cpu_kernels

TESTS = Path(__file__).parent
SUITES = ["test_cpu_ops.py", "test_quant_linear.py", "test_decoder_layers.py", "test_hybrid_attention.py"]


@pytest.mark.parametrize("flags", ["-mno-avx512f", "-mno-avx512f -mno-avx2 -mno-fma"])
def test_kernels_built_for_narrower_isas_match_their_references(flags, tmp_path):
    if not cpu_kernels.available():
        pytest.skip("no C compiler: the torch paths run everywhere")
    env = {**os.environ, cpu_kernels.FLAGS_ENV: flags}
    check = subprocess.run([sys.executable, "-c", "from specray.kernels import cpu_kernels; "
                            "import sys; sys.exit(cpu_kernels.library() is None)"], env=env, timeout=300)
    assert check.returncode == 0, f"the kernels did not build with {flags}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
                          *[str(TESTS / s) for s in SUITES]], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
