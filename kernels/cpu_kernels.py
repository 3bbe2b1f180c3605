"""The C kernels under `csrc/`, compiled once per machine with the system C compiler.

The shared library lands in the specray cache, keyed by the sources, the flags and the CPU
(-march=native binaries never cross CPUs). It links the libgomp that torch already loaded (same
soname), so its OpenMP loops share torch's thread pool instead of spinning against it. Without a
compiler (or with SPECRAY_CPU_KERNELS=0) `library()` is None and callers keep their torch paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = [CSRC / "quant_linear.c", CSRC / "fast_linear.c", CSRC / "cpu_ops.c", CSRC / "attention.c",
           CSRC / "attention_f16.c", CSRC / "decoder.c", CSRC / "parallel.c"]
HEADERS = [CSRC / "vec16.h", CSRC / "kv_type.h", CSRC / "parallel.h", CSRC / "fast_linear_avx512.h", CSRC / "fast_linear_avx2.h",
           CSRC / "attention_hybrid.h", CSRC / "attention_scores.h"]
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
# Extra compiler flags, e.g. "-mno-avx512f" to run the AVX2 paths on an AVX-512 machine (the tests do)
FLAGS_ENV = "SPECRAY_CPU_KERNEL_FLAGS"

P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES = {  # function -> argument types (pointers are data_ptr() ints)
    "specray_exact_linear": [P, I64, I64, P, I32, I64, P, I32],  # x, rows, in, blocks, kind, out, y, threads
    "specray_fast_scratch_bytes": [I64, I64],  # rows, in -> bytes of quantised activations
    "specray_fast_quantize": [P, I64, I64, P],  # x, rows, in, act
    "specray_fast_linear_q": [P, I64, I64, P, I32, I64, P, I32],  # act, rows, in, blocks, kind, out, y, threads
    "specray_fast_linear": [P, I64, I64, P, I32, I64, P, P, I32],  # x, rows, in, blocks, kind, out, y, act, threads
    "specray_fast16_quantize": [P, I64, I64, P],  # x, rows, in, act (2 * rows activation rows)
    "specray_fast16_linear": [P, I64, I64, P, I32, I64, P, P, I32],  # as specray_fast_linear
    "specray_rms_norm": [P, I64, I64, P, F32, P],  # x, rows, n, weight, eps, y
    "specray_add_rms_norm": [P, P, I64, I64, P, F32, P],  # h, delta, rows, n, weight, eps, y
    "specray_argmax_rows": [P, I64, I64, P, I32],  # x, rows, n, out (int64), threads
    "specray_silu_mul": [P, I64, I64, P],  # gate_up, rows, n, act
    "specray_rope_store_kv": [P, I64, I64, I64, I64, P, P, P, P, I64, I32],  # ..., kv, num_slots, kv_half
    # q, q_stride, rows, heads, kv_heads, dim, kv, num_slots, key_slots, key_start, num_ctx, num_new,
    # num_pad, new_mask, max_new, scale, out, scratch, max_keys, threads
    "specray_attention": [P, I64, I64, I64, I64, I64, P, I64, P, P, P, P, P, P, I64, F32, P, P, I64, I32],
    "specray_attention_f16": [P, I64, I64, I64, I64, I64, P, I64, P, P, P, P, P, P, I64, F32, P, P, I64, I32],
    "specray_attention_split_scratch": [I64, I64, I64, I64, I64],  # rows, heads, kv_heads, dim, max_new -> floats
    "specray_attention_score_floats": [I64, I64],  # group, max_keys -> floats of score scratch
    "specray_set_attention_split": [I64, I64, I64],  # min context, min and max rows for the hybrid (split) attention
    "specray_decoder_workspace": [I64, P, I64],  # rows, dims, max_keys -> floats
    # h, rows, dims, eps, scale, weights, kinds, kv, kv_layer_stride, kv_half, num_slots, cos, sin, slots,
    # key_slots, key_start, num_ctx, num_new, num_pad, new_mask, max_new, max_keys, work, threads
    "specray_decoder_layers": [P, I64, P, F32, F32, P, P, P, I64, I32, I64, P, P, P,
                               P, P, P, P, P, P, I64, I64, P, I32],
    "specray_decoder_logits_workspace": [I64, I64],  # n, hidden -> floats
    # h, rows, picked, n, hidden, norm, eps, head blocks, head kind, vocab, logits, normed (or NULL), work, threads
    "specray_decoder_logits": [P, I64, P, I64, I64, P, F32, I64, I32, I64, P, P, P, I32],
    "specray_parallel_check": [I64, I64, I32, P],  # n, chunk, threads, seen (int32 [n]): the loops' test
}
RESTYPES = {"specray_decoder_workspace": I64, "specray_decoder_logits_workspace": I64,
            "specray_attention_split_scratch": I64, "specray_fast_scratch_bytes": I64,
            "specray_attention_score_floats": I64}  # the rest return nothing

_LIBRARY: ctypes.CDLL | None | bool = False  # False: not tried yet


def library() -> ctypes.CDLL | None:
    global _LIBRARY
    if _LIBRARY is False:
        _LIBRARY = None
        if os.environ.get("SPECRAY_CPU_KERNELS", "1") != "0":
            try:
                _LIBRARY = _bind(ctypes.CDLL(str(_build())))
            except (OSError, subprocess.SubprocessError) as e:
                warnings.warn(f"specray: C kernels unavailable, using the torch paths ({e})")
    return _LIBRARY or None


def available() -> bool:
    return library() is not None


def build_id() -> str:
    """Which CPU kernels this process runs: the library's name (it hashes the sources, the flags and
    the CPU), or "torch" without them."""
    lib = library()
    return "torch" if lib is None else Path(lib._name).stem


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, RESTYPES.get(name)
    return lib


def _build() -> Path:
    from specray.kernels.loader import cache_root

    compiler = os.environ.get("CC", "cc")
    flags = CFLAGS + os.environ.get(FLAGS_ENV, "").split()
    digest = hashlib.sha256(" ".join([compiler, *flags]).encode() + _cpu_signature().encode())
    for src in SOURCES + HEADERS:
        digest.update(src.read_bytes())
    out = cache_root() / "kernels" / f"specray_cpu-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # atomic: concurrent workers may build
        built = Path(tmp) / out.name
        subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(built), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(built, out)
    return out


def _cpu_signature() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
    return platform.machine() + "\n".join(sorted(set(lines)))
