"""Acceptance 1: `pdserve up` (the real CLI, as a subprocess) then `pdserve generate`; greedy output through
Generate equals the offline engine's token for token; Ctrl-C stops every process the CLI started."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.ports import free_port
from cli.running_cluster import notes_folder
from client.generation_client import GenerationClient
from common.child_process import popen_child
from tests.e2e.support import POD_ARGS, STARTUP_TIMEOUT_S, Oracle, run_concurrently, up_env
from tests.process_tree import descendants, still_running

_SCRIPT = Path(sys.executable).with_name("pdserve")
PDSERVE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli.main"]
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
    "The three primary colors are",
    "Once upon a time, in a small village,",
    "The largest planet in our solar system is",
    "To make a cup of tea, first",
    "1, 2, 3, 4, 5,",
]
MAX_TOKENS = 12


@dataclass
class Up:
    """A running `pdserve up` and what it printed."""

    process: subprocess.Popen[str]
    address: str
    log_dir: Path
    stderr_path: Path
    env: dict[str, str]
    """Its environment, which `pdserve status` needs to find it: XDG_RUNTIME_DIR a folder of its own."""
    metrics_urls: dict[str, str]
    """What `pdserve up` listed under its first line: process name -> /metrics URL."""

    def logs(self) -> str:
        parts = [f"----- pdserve up stderr -----\n{_tail(self.stderr_path)}"]
        parts += [f"----- {log.name} -----\n{_tail(log)}" for log in sorted(self.log_dir.glob("*.log"))]
        return "\n".join(parts)


def _tail(path: Path, num_lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:]) if path.exists() else "(none)"


def _forward_lines(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    for line in process.stdout or ():
        lines.put(line)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    port = free_port()
    log_dir = tmp_path_factory.mktemp("pdserve-up-logs")
    stderr_path = log_dir / "pdserve-up.stderr"
    argv = [
        *PDSERVE,
        "up",
        "--prefill",
        "1",
        "--decode",
        "1",
        "--port",
        str(port),
        "--log-dir",
        str(log_dir),
        "--registry-refresh-s",
        "0.2",
        "--metrics-port",
        "0",
        "--http-port",
        str(free_port()),
        *POD_ARGS,
    ]
    env = up_env(tmp_path_factory.mktemp("xdg-runtime"))
    with stderr_path.open("w") as stderr:
        process = popen_child(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_forward_lines, args=(process, lines), daemon=True).start()
    running = Up(process, f"127.0.0.1:{port}", log_dir, stderr_path, env, {})
    try:
        line = lines.get(timeout=STARTUP_TIMEOUT_S)
        for _ in range(3):
            name, _, url = lines.get(timeout=5.0).strip().partition(" metrics: ")
            running.metrics_urls[name] = url
    except queue.Empty:
        line = line if running.metrics_urls else ""
    try:
        assert line.startswith(f"pdserve router listening on 127.0.0.1:{port} "), f"got {line!r}\n{running.logs()}"
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_pdserve_generate_prints_smollm2s_completion(up: Up, oracle: Oracle) -> None:
    argv = [
        *PDSERVE,
        "generate",
        "The capital of France is",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--address",
        up.address,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{done.stderr}\n{up.logs()}"
    assert done.stdout.startswith(" Paris")
    [expected] = oracle.greedy(["The capital of France is"], 8)
    assert done.stdout == expected.text + "\n"
    num_prompt_tokens = len(oracle.encode("The capital of France is"))
    assert f"finish_reason=length prompt_tokens={num_prompt_tokens} completion_tokens=8 " in done.stderr


def test_greedy_output_equals_the_offline_engine_token_for_token(up: Up, oracle: Oracle) -> None:
    expected = oracle.greedy(PROMPTS, MAX_TOKENS)
    with GenerationClient(up.address) as client:
        completions = run_concurrently(
            client, [{"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0.0} for p in PROMPTS]
        )
    assert [c.token_ids for c in completions] == [e.token_ids for e in expected], up.logs()
    assert [c.text for c in completions] == [e.text for e in expected]


def test_pdserve_up_lists_each_process_metrics_url_and_they_answer(up: Up) -> None:
    assert sorted(up.metrics_urls) == ["decode-0", "prefill-0", "router"], up.metrics_urls
    for name, url in up.metrics_urls.items():
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
        with urllib.request.urlopen(url, timeout=5.0) as response:
            assert "pdserve:time_to_first_token_seconds" in response.read().decode(), name


def test_pdserve_generate_prints_the_bad_field_and_exits_non_zero(up: Up) -> None:
    argv = [*PDSERVE, "generate", "hello", "--top-p", "0", "--address", up.address]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "error: INVALID_ARGUMENT" in done.stderr
    assert "\n  sampling_params.top_p: " in done.stderr


def test_pdserve_status_without_flags_shows_the_pods_and_router_of_pdserve_up(up: Up) -> None:
    shown = subprocess.run([*PDSERVE, "status"], capture_output=True, text=True, timeout=60, env=up.env)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()]
    assert [row[:3] for row in rows[1:3]] == [["decode-0", "decode", "serving"], ["prefill-0", "prefill", "serving"]]
    assert rows[3:] == [[], ["ROUTER", "STATE"], [up.address, "serving"]]


def test_ctrl_c_stops_every_process_pdserve_up_started(up: Up) -> None:
    tree = descendants(up.process.pid)
    children = [p for p in tree if p.parent_pid == up.process.pid]
    assert len(children) == 4, children  # redis-server, one prefill pod, one decode pod, the router
    assert len(tree) > 4, tree  # and theirs: the router's tokenizer workers
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(60) == 0, up.logs()
    assert still_running(tree, 0.0) == []
    assert list(notes_folder(up.env).iterdir()) == []  # the note `pdserve status` found it by is gone too
