"""The numeric modes of the packed CPU kernels (kernels/cpu_weights.py, kernels/fast_linear.py), and
the `auto` setting that picks one where the model loads (kernels/loader.py)."""

from __future__ import annotations

KERNEL_MODES = ("exact", "fast16", "fast")  # numeric modes of the packed projections
FAST_PARTS = {"fast": 1, "fast16": 2}  # the fast layout's modes: activation parts a row
KERNELS_AUTO = "auto"  # AUTO_CPU_MODE where the weights are GGUF blocks on a CPU in fp32, else exact
AUTO_CPU_MODE = "fast16"
KERNEL_SETTINGS = (KERNELS_AUTO, *KERNEL_MODES)  # what `kernels` may be set to


def check_kernel_mode(mode: str) -> None:
    if mode not in KERNEL_MODES:
        raise ValueError(f"kernels must be one of {KERNEL_MODES}, got {mode!r}")


def check_kernel_setting(setting: str) -> None:
    if setting not in KERNEL_SETTINGS:
        raise ValueError(f"kernels must be one of {KERNEL_SETTINGS}, got {setting!r}")
