# Source on the GPU machine, in the repo root, at the start of a command (the run carries `.whl`, filled here
# once by scripts/device_wheels.sh):
#   source scripts/device_env.sh && python3 -m bench ...
# Installs the carried wheels into $DEVICE_ROOT/site (first on PYTHONPATH, then the repo and protos/), unpacks
# the carried redis-server and the libraries it links into $DEVICE_ROOT/redis, puts a `redis-server` on PATH that
# finds them (LD_LIBRARY_PATH for that process alone), and prints the versions in use. Non-zero on any failure.
#
# Environment: DEVICE_ROOT (default /tmp), WHEEL_DIR (default .whl).

_pdserve_device_env() {
  local root="${DEVICE_ROOT:-/tmp}" wheels="${WHEEL_DIR:-.whl}"
  local site="$root/site" redis="$root/redis"
  if ! compgen -G "$wheels/*.whl" >/dev/null || [[ ! -f "$wheels/redis-server.deb" ]]; then
    echo "device_env: no wheels or redis-server.deb in $wheels (run scripts/device_wheels.sh, carry .whl)" >&2
    return 1
  fi
  python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$wheels"/*.whl || return 1
  # NOTE: protos/ holds the generated package `pdserve.v1` (an editable install maps it; there, nothing is installed).
  export PYTHONPATH="$site:$PWD:$PWD/protos${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1

  # NOTE: a .deb is an ar archive holding data.tar.*; unpacked with Python, so no dpkg is needed there.
  python3 - "$redis" "$wheels"/*.deb <<'PY' || return 1
import io
import pathlib
import sys
import tarfile

dest = pathlib.Path(sys.argv[1])
for deb in sys.argv[2:]:
    data = pathlib.Path(deb).read_bytes()
    if data[:8] != b"!<arch>\n":
        sys.exit(f"{deb} is not a .deb")
    pos = 8
    while pos < len(data):
        name, size = data[pos : pos + 16].decode().strip().rstrip("/"), int(data[pos + 48 : pos + 58])
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data[pos + 60 : pos + 60 + size])) as tar:
                tar.extractall(dest, filter="tar")
        pos += 60 + size + size % 2
PY
  mkdir -p "$redis/bin"
  local libs="$redis/usr/lib/x86_64-linux-gnu:$redis/lib/x86_64-linux-gnu"
  # NOTE: exec through the redis-server symlink: the binary picks its mode from the name it was run as.
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
    "$libs" "$redis/usr/bin/redis-server" >"$redis/bin/redis-server"
  chmod +x "$redis/bin/redis-server"
  export PATH="$redis/bin:$PATH"

  redis-server --version || return 1
  python3 - <<'PY' || return 1
import importlib.metadata as md
import sys

names = ["torch", "triton", "transformers", "tokenizers", "grpcio", "protobuf", "grpcio-health-checking",
         "grpcio-reflection", "grpcio-status", "googleapis-common-protos", "redis", "opentelemetry-sdk",
         "prometheus-client", "numpy", "tqdm", "gguf"]
def version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "MISSING"


print(f"python {sys.version.split()[0]}; " + ", ".join(f"{n} {version(n)}" for n in names))
import common.telemetry, router.__main__, prefill_service.__main__, decode_service.__main__  # noqa: E401,F401
PY
}
_pdserve_device_env
