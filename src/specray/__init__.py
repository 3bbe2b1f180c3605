"""specray: lossless speculative decoding served on Ray.

The offline API is shaped like vLLM's: ``LLM``, ``SamplingParams``, ``RequestOutput``.
"""

import os as _os
import sys as _sys

# torch's OpenMP threads spin for milliseconds after each of torch's parallel ops by default, and
# would fight the C kernels' own threads for the cores (kernels/cpu_kernels.py); a short spin keeps
# torch's back-to-back ops (a prefill's) as fast. libgomp reads this once, when torch loads: in a
# process that imported torch first, or with a wait policy or spin count of the user's own, the
# kernels run on torch's OpenMP team instead (unless the policy is passive or the spin short).
_SHORT_SPIN = 100_000
if "torch" not in _sys.modules and "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ.setdefault("GOMP_SPINCOUNT", "10000")
_policy = _os.environ.get("OMP_WAIT_POLICY", "").upper()
_spins = _os.environ.get("GOMP_SPINCOUNT", "")
OWN_KERNEL_THREADS = _policy == "PASSIVE" or (_policy != "ACTIVE" and _spins.isdigit() and int(_spins) <= _SHORT_SPIN)

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name: str):
    # Lazy so that `import specray.protos` (the client SDK) never pulls torch.
    if name in __all__:
        from specray.cluster import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specray' has no attribute {name!r}")
