#!/usr/bin/env bash
# Regenerate the Python stubs (_pb2.py, _pb2.pyi, _pb2_grpc.py) of every protos/specray/v1/*.proto.
# The generated files are committed; run this after editing a .proto and commit both.
#
# grpcio-tools is pinned and lives in its own virtualenv: the code it generates checks at import
# time that the installed protobuf/grpcio are at least the versions it was generated with, so the
# pin fixes the floors declared in pyproject.toml and protos/pyproject.toml (a test checks them).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS_VERSION=1.76.0  # bundles protoc 31.1: gencode needs protobuf >= 6.31.1, grpcio >= 1.76.0
VENV="${SPECRAY_PROTOC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specray/grpcio-tools-$TOOLS_VERSION}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import grpc_tools" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "grpcio-tools==$TOOLS_VERSION"
fi
OUT=protos/specray/v1
rm -f "$OUT"/*_pb2.py "$OUT"/*_pb2.pyi "$OUT"/*_pb2_grpc.py
"$VENV/bin/python" -m grpc_tools.protoc -I protos \
  --python_out=protos --pyi_out=protos --grpc_python_out=protos protos/specray/v1/*.proto
# protoc names modules after the proto package (specray.v1); they live under specray.protos. Fix the
# imports and the message classes' __module__ (pickling, e.g. by Ray Serve, imports it by that name).
sed -i -E -e 's/^from specray\.v1 import/from specray.protos.specray.v1 import/' \
  -e "s/'specray\.v1\.(\w+_pb2)'/'specray.protos.specray.v1.\1'/" \
  "$OUT"/*_pb2.py "$OUT"/*_pb2.pyi "$OUT"/*_pb2_grpc.py
echo "generated: $(ls "$OUT" | grep -E '_pb2' | tr '\n' ' ')"
