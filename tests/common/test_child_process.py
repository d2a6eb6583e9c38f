"""common.child_process over real processes: a child started by `popen_child` dies with its parent however the
parent ends, also when the thread that asked for the child ended long before; a process calling `die_with_parent`
after its parent is already gone kills itself at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.process_tree import descendants, running, still_running

_PARENT = """
import subprocess, sys, threading
from common.child_process import popen_child

# NOTE: a thread that ends right after asking: the kernel ties the parent-death signal to the forking thread.
asker = threading.Thread(target=lambda: popen_child(["sleep", "60"], stdout=subprocess.DEVNULL))
asker.start()
asker.join()
print("started", flush=True)
sys.stdin.read()
sys.exit(3)
"""
GONE_WITHIN_S = 10.0
"""Bound on the kernel's SIGKILL reaching the child (at once) and the test seeing it, on a loaded machine."""


@pytest.mark.parametrize("parent_end", ["SIGKILL", "exit"])
def test_a_child_dies_with_its_parent_not_with_the_thread_that_asked_for_it(parent_end: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "started\n"
        time.sleep(0.5)
        # NOTE: read after the pause: the child starts as the shim that sets its parent-death signal, then execs.
        [child] = descendants(parent.pid)
        assert running(child), "the child died with the thread that asked for it"
        assert child.command == "sleep 60"
        if parent_end == "SIGKILL":
            parent.kill()
        else:
            parent.communicate("")
        assert parent.wait(10) == (-signal.SIGKILL if parent_end == "SIGKILL" else 3)
        assert still_running([child], GONE_WITHIN_S) == []
    finally:
        parent.kill()
        parent.wait()


def test_die_with_parent_kills_a_process_whose_parent_is_already_gone() -> None:
    code = "from common.child_process import die_with_parent\ndie_with_parent(1)\nprint('still here')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (-signal.SIGKILL, "")


def test_the_check_passes_for_the_real_parent() -> None:
    code = "import os\nfrom common.child_process import die_with_parent\ndie_with_parent(os.getppid())\nprint('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n")
