"""specray: lossless speculative decoding served on Ray.

The offline API is shaped like vLLM's: ``LLM``, ``SamplingParams``, ``RequestOutput``.
"""

import os as _os
import sys as _sys

# torch's OpenMP threads sleep between torch's ops instead of spinning for milliseconds, so they do
# not fight the C kernels' own threads for the cores (kernels/cpu_kernels.py). libgomp reads this
# once, when torch loads: a process that imported torch first keeps its policy, and the kernels then
# run on torch's OpenMP team. An OMP_WAIT_POLICY the user set is kept.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
TORCH_THREADS_SLEEP = _os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name: str):
    # Lazy so that `import specray.protos` (the client SDK) never pulls torch.
    if name in __all__:
        from specray.cluster import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specray' has no attribute {name!r}")
