"""However `pdserve up` or `pdserve bench` is stopped mid-run (SIGTERM, SIGKILL), no process it started is left
behind: neither its children (Redis, the pods, the router, the benchmark's client processes) nor theirs (the router's
tokenizer workers).

Each test starts the real CLI as a subprocess, waits until its process tree is up, reads the tree from /proc, signals
the launcher, and waits for every process of the tree to be gone. SIGTERM stops the children gracefully (the router,
then the pods drain, Redis last); after a SIGKILL the kernel's parent-death signals take them (`common.child_process`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from cli.ports import free_port
from common.child_process import popen_child
from tests.e2e.support import POD_ARGS, STARTUP_TIMEOUT_S, up_env
from tests.process_tree import ProcessId, descendants, still_running

_SCRIPT = Path(sys.executable).with_name("pdserve")
PDSERVE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli.main"]
GONE_WITHIN_S = {signal.SIGTERM: 60.0, signal.SIGKILL: 10.0}
"""SIGTERM: the graceful stop, each process's part bounded by the cluster's 35 s stop timeout (an idle cluster takes
a few seconds); SIGKILL: the kernel's signals, at once (the bound covers a loaded 2-core machine)."""
CLUSTER = ("redis-server", "-m prefill_service", "-m decode_service", "-m router", "multiprocessing.forkserver")
"""What each launcher's tree holds, by command line: its cluster, and the router's tokenizer workers."""
BENCH_CLIENTS = 2
STOPS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]


def _launch(argv: Sequence[str], output: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    with output.open("w") as out:
        launcher: subprocess.Popen[str] = popen_child(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    return launcher


def _tree_once(
    launcher: subprocess.Popen[str], output: Path, ready: Callable[[list[ProcessId]], bool]
) -> list[ProcessId]:
    """The launcher's process tree, once `ready` says it is up (polled); fails with the launcher's output if it exits
    or takes longer than a cluster's start."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not ready(tree := descendants(launcher.pid)):
        assert launcher.poll() is None, f"the launcher exited with code {launcher.returncode}:\n{output.read_text()}"
        assert time.monotonic() < deadline, f"not up after {STARTUP_TIMEOUT_S} s:\n{output.read_text()}"
        time.sleep(0.2)
    return tree


def _holds(tree: list[ProcessId], *parts: str) -> bool:
    return all(any(part in process.command for process in tree) for part in parts)


def _stop(launcher: subprocess.Popen[str], tree: list[ProcessId], sig: signal.Signals, code: int, output: Path) -> None:
    """Send `sig` to the launcher; it must exit with `code`, and every process of `tree` go within the bound."""
    launcher.send_signal(sig)
    try:
        exit_code = launcher.wait(GONE_WITHIN_S[sig])
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher still runs {GONE_WITHIN_S[sig]} s after {sig.name}:\n{_report(output)}")
    assert exit_code == code, _report(output)
    left = still_running(tree, GONE_WITHIN_S[sig])
    assert left == [], f"left behind: {left}\n{_report(output)}"


def _report(output: Path) -> str:
    """The launcher's output (it logs when each child exits) and the tail of each child's log."""
    sections = [output.read_text()]
    for log in sorted((output.parent / "logs").glob("*.log")):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        sections.append(f"----- {log.name} -----\n{tail}")
    return "\n".join(sections)


@pytest.mark.slow
@pytest.mark.parametrize("sig", STOPS)
def test_pdserve_up_leaves_no_process_behind(sig: signal.Signals, tmp_path: Path) -> None:
    env = up_env(tmp_path / "runtime")
    output = tmp_path / "pdserve-up.out"
    flags = ["--http-port", "0", "--metrics-port", "-1", "--registry-refresh-s", "0.2", "--port", str(free_port())]
    argv = [*PDSERVE, "up", *flags, "--log-dir", str(tmp_path / "logs"), *POD_ARGS]
    launcher = _launch(argv, output, env)
    try:
        tree = _tree_once(launcher, output, lambda tree: "pdserve router listening" in output.read_text())
        assert _holds(tree, *CLUSTER), tree
        _stop(launcher, tree, sig, 0 if sig == signal.SIGTERM else -signal.SIGKILL, output)
    finally:
        launcher.kill()
        launcher.wait()
    # NOTE: `pdserve status` finds no cluster: SIGTERM removed the note it finds one by; SIGKILL left the note unlocked.
    shown = subprocess.run([*PDSERVE, "status"], capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 1
    assert shown.stderr.startswith("pdserve status: no `pdserve up` cluster is running"), shown.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", STOPS)
def test_pdserve_bench_leaves_no_process_behind(sig: signal.Signals, tmp_path: Path) -> None:
    output = tmp_path / "pdserve-bench.out"
    # NOTE: 400 requests at concurrency 2 keep it running well past the moment its client processes are up.
    load = ["--concurrency", "2", "--num-prompts", "400", "--input-len", "16", "--output-len", "4"]
    clients = ["--warmup-prompts", "2", "--client-procs", str(BENCH_CLIENTS), "--no-progress"]
    logs = ["--pod-arg", " ".join(POD_ARGS), "--log-dir", str(tmp_path / "logs")]
    argv = [*PDSERVE, "bench", "--workload", "w8", *load, *clients, *logs]
    launcher = _launch(argv, output, up_env(tmp_path / "runtime"))

    def clients_running(tree: list[ProcessId]) -> bool:
        return sum("multiprocessing.spawn" in p.command and p.parent_pid == launcher.pid for p in tree) == BENCH_CLIENTS

    try:
        tree = _tree_once(launcher, output, clients_running)
        assert _holds(tree, *CLUSTER), tree
        _stop(launcher, tree, sig, 130 if sig == signal.SIGTERM else -signal.SIGKILL, output)
    finally:
        launcher.kill()
        launcher.wait()
