"""The compose connector over a fake command runner: the exact commands it runs, the role pending while one runs,
a failed command, the choice of the compose CLI, and `pdserve autoscale --connector compose` refusing to start
without one."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence

import pytest

from autoscaler.compose_connector import ComposeConnector, find_compose_command
from autoscaler.config import ComposeConfig
from autoscaler.planner import Decision
from cli.main import main
from common.errors import InvalidArgumentError

CONFIG = ComposeConfig(
    compose_file="/etc/pdserve/docker-compose.yml", compose_project="pdserve-e2e", compose_timeout_s=90.0
)


class FakeRunner:
    """Records (argv, timeout) and answers `returncode`; with `hold`, each call waits until it is released."""

    def __init__(self, returncode: int = 0, hold: bool = False) -> None:
        self.calls: list[tuple[list[str], float]] = []
        self.returncode = returncode
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.calls.append((list(argv), timeout_s))
        self.release.wait(10)
        return subprocess.CompletedProcess(list(argv), self.returncode, "Error: no such service\n")


def wait_not_pending(connector: ComposeConnector) -> None:
    deadline = time.monotonic() + 10
    while connector.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connector.pending() == frozenset()


def test_scale_out_and_in_run_compose_up_with_the_target_count() -> None:
    run = FakeRunner()
    connector = ComposeConnector(CONFIG, ["docker-compose"], run)
    connector.scale(Decision("decode", 1, 2, "up", "kv"), [])
    wait_not_pending(connector)
    connector.scale(Decision("prefill", 3, 2, "down", "idle"), [])
    wait_not_pending(connector)
    connector.close()
    base = [
        "docker-compose",
        "-f",
        "/etc/pdserve/docker-compose.yml",
        "-p",
        "pdserve-e2e",
        "up",
        "-d",
        "--no-deps",
        "--no-recreate",
        "--scale",
    ]
    assert run.calls == [([*base, "decode=2", "decode"], 90.0), ([*base, "prefill=2", "prefill"], 90.0)]


def test_without_file_and_project_the_cli_defaults_apply() -> None:
    connector = ComposeConnector(ComposeConfig(), ["podman", "compose"], FakeRunner())
    assert connector.scale_argv("prefill", 4) == [
        "podman",
        "compose",
        "up",
        "-d",
        "--no-deps",
        "--no-recreate",
        "--scale",
        "prefill=4",
        "prefill",
    ]


def test_a_role_is_pending_while_its_command_runs_and_a_second_change_is_ignored() -> None:
    run = FakeRunner(hold=True)
    connector = ComposeConnector(CONFIG, ["docker", "compose"], run)
    connector.scale(Decision("decode", 2, 1, "down", "idle"), [])
    assert connector.pending() == frozenset({"decode"})
    connector.scale(Decision("decode", 2, 3, "up", "kv"), [])
    run.release.set()
    wait_not_pending(connector)
    connector.close()
    assert [argv[-2:] for argv, _ in run.calls] == [["decode=1", "decode"]]


def test_a_failed_command_ends_the_pending_change_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    run = FakeRunner(returncode=1)
    connector = ComposeConnector(CONFIG, ["docker-compose"], run)
    connector.scale(Decision("prefill", 1, 2, "up", "queue"), [])
    wait_not_pending(connector)
    connector.close()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "autoscaler: docker-compose -f /etc/pdserve/docker-compose.yml -p pdserve-e2e up -d --no-deps --no-recreate "
        "--scale prefill=2 prefill exited with 1:\nError: no such service\n"
    ]


def test_the_configured_command_is_shell_split() -> None:
    assert find_compose_command("podman --remote compose", lambda _: None) == ["podman", "--remote", "compose"]


@pytest.mark.parametrize(
    ("installed", "plugin_rc", "expected"),
    [
        ({"docker", "docker-compose"}, 0, ["docker", "compose"]),
        ({"docker", "docker-compose"}, 1, ["docker-compose"]),
        ({"podman", "podman-compose"}, 0, ["podman", "compose"]),
        ({"podman", "podman-compose"}, 125, ["podman-compose"]),
    ],
)
def test_the_first_compose_cli_found_is_used(installed: set[str], plugin_rc: int, expected: list[str]) -> None:
    probes: list[list[str]] = []

    def run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        probes.append(list(argv))
        return subprocess.CompletedProcess(list(argv), plugin_rc, "")

    assert find_compose_command("", lambda name: f"/usr/bin/{name}" if name in installed else None, run) == expected
    plugin = ["docker" if "docker" in installed else "podman", "compose", "version"]
    assert probes == [plugin]


def test_no_compose_cli_is_an_error_naming_the_flag() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        find_compose_command("", lambda _: None)
    assert caught.value.description == (
        "--compose-command: no compose CLI found (tried docker compose, docker-compose, podman compose, podman-compose)"
    )


def test_autoscale_with_compose_and_no_cli_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["autoscale", "--redis-url", "redis://127.0.0.1:1/0", "--connector", "compose"]) == 2
    assert capsys.readouterr().err.startswith("pdserve autoscale: --compose-command: no compose CLI found")


def test_a_bad_compose_timeout_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PDSERVE_COMPOSE_TIMEOUT_S", "soon")
    assert main(["autoscale", "--redis-url", "redis://127.0.0.1:1/0", "--connector", "compose"]) == 2
    assert capsys.readouterr().err == "pdserve autoscale: PDSERVE_COMPOSE_TIMEOUT_S: invalid float value 'soon'\n"
