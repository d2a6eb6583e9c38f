#!/usr/bin/env bash
# Run HERE, once, on a Debian/Ubuntu x86-64 machine with network access: fills .whl/ (git-ignored) with what the
# GPU machine lacks to run a pdserve cluster there (router, pods, Redis, the online benchmarks):
#   - pinned wheels for CPython 3.12, no dependencies resolved (each pin's needs are pinned here too);
#   - Debian's redis-server (and redis-tools) as .deb packages, plus the library packages they depend on (their
#     Depends, closed over the libraries' own) beyond glibc and the C++ runtime, so that they run whatever the
#     GPU machine's distribution holds; ldd on the unpacked binaries then checks that nothing else is needed.
# There, at the start of each command: `source scripts/device_env.sh` (with `.whl` in the run's carry list).
#
# Environment: WHEEL_DIR (default .whl).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST="${WHEEL_DIR:-.whl}"

# NOTE: the GPU machine has grpcio 1.84 and an unknown protobuf. The generated pdserve/v1 code (grpcio-tools 1.84,
# protoc 7.35.1) needs protobuf >= 7.35.1 at run time, and grpcio-health-checking/-reflection 1.84 need the same,
# so protobuf travels too (first on PYTHONPATH, it shadows the machine's own). The grpcio-* helpers are pinned to
# 1.84.0: each refuses to import under a grpcio older than itself. gguf (GGUF files loaded directly) needs only
# numpy, pyyaml, requests and tqdm, which the GPU machine has. opentelemetry's exporters are all imported by
# common/telemetry.py at start-up, tracing on or off. starlette and uvicorn (+ h11) serve the router's HTTP API,
# which router/router_app.py imports; uvloop runs the router's event loop (router/__main__.py); anyio, click and
# httpx are on the GPU machine already (transformers' deps). pillow decodes image inputs (engine.multimodal).
WHEELS=(
  protobuf==7.36.2
  googleapis-common-protos==1.76.0
  grpcio-health-checking==1.84.0
  grpcio-reflection==1.84.0
  grpcio-status==1.84.0
  redis==8.1.0
  gguf==0.19.0
  starlette==1.10.0
  uvicorn==0.54.0
  uvloop==0.23.0
  pillow==13.0.0
  h11==0.16.0
  opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  opentelemetry-proto==1.45.2
  opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2
)
# Libraries every Linux with a C++ toolchain has (and newer than Debian 12's): not carried.
BASE_PACKAGES="libc6 libstdc++6 libgcc-s1"

rm -rf "$DEST"
mkdir -p "$DEST"
echo "==> wheels into $DEST"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${WHEELS[@]}"

echo "==> redis-server, redis-tools and the packages of the libraries their binaries link"
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
(cd "$workdir" && apt-get download -qq redis-server redis-tools 2>/dev/null)
mkdir -p "$workdir/root"
for deb in "$workdir"/*.deb; do dpkg-deb -x "$deb" "$workdir/root"; done
# The package that holds a library (by file name: on merged-/usr systems its path may be /lib or /usr/lib).
owner() { dpkg -S "*/$(basename "$1")" 2>/dev/null | head -n1 | cut -d: -f1; }
linked() { ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'; }
# NOTE: every binary the packages ship, not only redis-server (in Debian 12 a symlink to redis-check-rdb):
# redis-cli and redis-benchmark are linked apart and could need more.
binaries() { find "$1/usr/bin" -type f -perm -u+x | sort; }
# The library packages (lib*) a downloaded .deb depends on (first alternative of each).
lib_depends() { dpkg-deb -f "$1" Depends | tr ',' '\n' | sed 's/[|(].*//; s/[[:space:]]//g; s/:any$//' | grep '^lib' || true; }
# NOTE: the libraries come from the packages' Depends, closed over theirs, not from ldd here: this machine may lack
# a library redis links (liblzf1, libjemalloc2), and ldd skips what it cannot find. The check below runs ldd on
# the carried tree, so a library nobody declared still fails it.
packages=()
pending=("$workdir"/*.deb)
while ((${#pending[@]})); do
  next=()
  for dep in $(for deb in "${pending[@]}"; do lib_depends "$deb"; done | sort -u); do
    [[ " $BASE_PACKAGES ${packages[*]} " == *" $dep "* ]] && continue
    packages+=("$dep")
    (cd "$workdir" && apt-get download -qq "$dep" 2>/dev/null) || { echo "cannot download $dep" >&2; exit 1; }
    next+=("$(ls "$workdir"/"$dep"_*.deb)")
  done
  pending=("${next[@]}")
done
echo "    libraries beyond the base: ${packages[*]}"
# NOTE: plain names (apt's file names carry the epoch as %3a).
for deb in "$workdir"/*.deb; do
  name="$(dpkg-deb -f "$deb" Package)"
  cp "$deb" "$DEST/$name.deb"
done

# Check: with only the carried libraries on LD_LIBRARY_PATH, nothing but the base resolves from this system.
for deb in "$DEST"/*.deb; do dpkg-deb -x "$deb" "$workdir/carried"; done
libpath="$workdir/carried/usr/lib/x86_64-linux-gnu:$workdir/carried/lib/x86_64-linux-gnu"
for bin in $(binaries "$workdir/carried"); do
  if LD_LIBRARY_PATH="$libpath" ldd "$bin" | grep 'not found' >&2; then
    echo "not found (linked by ${bin#"$workdir/carried/"})" >&2
    exit 1
  fi
  for lib in $(LD_LIBRARY_PATH="$libpath" linked "$bin"); do
    [[ "$lib" == "$workdir/carried/"* || " $BASE_PACKAGES " == *" $(owner "$lib") "* ]] \
      || { echo "not carried: $lib (linked by ${bin#"$workdir/carried/"})" >&2; exit 1; }
  done
done
LD_LIBRARY_PATH="$libpath" "$workdir/carried/usr/bin/redis-server" --version
LD_LIBRARY_PATH="$libpath" "$workdir/carried/usr/bin/redis-cli" --version

ls -l "$DEST"
du -sh "$DEST"
