#!/usr/bin/env bash
# Regenerates the Python code of protos/pdserve/v1/*.proto (messages, gRPC stubs, .pyi stubs).
# Run from the repository root. grpcio-tools is pinned: stubs from a newer one refuse to import
# under an older grpcio runtime (the GPU hosts run grpcio 1.84).
set -euo pipefail

GRPCIO_TOOLS_VERSION="1.84.0"

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi

installed="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')"
if [[ "$installed" != "$GRPCIO_TOOLS_VERSION" ]]; then
  echo "gen_protos: need grpcio-tools==$GRPCIO_TOOLS_VERSION, found $installed" >&2
  echo "  $PYTHON -m pip install grpcio-tools==$GRPCIO_TOOLS_VERSION" >&2
  exit 1
fi

# NOTE: protoc finds the protoc-gen-mypy plugins (mypy-protobuf) on PATH, beside the interpreter; decode.proto imports
# google/rpc/status.proto, which googleapis-common-protos installs beside its generated module.
PATH="$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
googleapis="$("$PYTHON" -c 'import os, google.rpc.status_pb2 as m; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))')"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$PYTHON" -m grpc_tools.protoc -I protos -I "$googleapis" \
  --python_out="$out" --grpc_python_out="$out" --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
  protos/pdserve/v1/*.proto

rm -f protos/pdserve/v1/*_pb2.py protos/pdserve/v1/*_pb2_grpc.py protos/pdserve/v1/*_pb2*.pyi
cp "$out"/pdserve/v1/* protos/pdserve/v1/
echo "gen_protos: generated $(ls "$out"/pdserve/v1 | wc -l) files in protos/pdserve/v1"
