"""vec16.h's masks formed from the bits (builds without AVX-512) are the comparisons' masks, bit for
bit: special values (zeros, +-87, infinities, NaNs, subnormals) and random bit patterns, on the
AVX-512, AVX2 and scalar builds."""

import shutil
import subprocess

import pytest

from specray.kernels import cpu_kernels

CHECK = r"""
#include <stdio.h>
#include <math.h>
#include <float.h>
#include "vec16.h"
int main(void) {
    float special[16] = {0.f, -0.f, -87.f, -87.00001f, -86.99999f, -INFINITY, INFINITY, NAN, -NAN,
                         -1e-40f, -1e30f, -FLT_MIN, 1.f, -1.f, 100.f, -100.f};
    unsigned state = 12345u;
    long bad = 0;
    for (long t = 0; t < 200000; t++) {
        float a[16];
        for (int k = 0; k < 16; k++) {
            state = state * 1664525u + 1013904223u;
            unsigned bits = t == 0 ? 0u : state;
            memcpy(&a[k], &bits, 4);
            if (t == 0) a[k] = special[k];
        }
        vec16 x = vload(a);
        ivec16 want = x < -87.f, got = below_minus_87(x);
        bad += memcmp(&want, &got, sizeof want) != 0;
    }
    printf("%ld\n", bad);
    return bad != 0;
}
"""


@pytest.mark.parametrize("flags", ["", "-mno-avx512f", "-mno-avx512f -mno-avx2 -mno-fma"])
def test_masks_from_the_bits_are_the_comparisons(flags, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "check.c").write_text(CHECK)
    build = subprocess.run([cc, "-O2", "-march=native", *flags.split(), "-std=gnu11", f"-I{cpu_kernels.CSRC}",
                            str(tmp_path / "check.c"), "-o", str(tmp_path / "check"), "-lm"],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "0", run.stdout
