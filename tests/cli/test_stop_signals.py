"""cli.stop_signals in a process of its own (a broken handler must not take the test run down with a SIGTERM): the
first SIGTERM interrupts the block, the signals that come while the children stop are ignored, and the previous
handlers come back."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import os, signal, time
from cli.stop_signals import stopping_on_signals

events = []
before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

def stop():
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    events.append("stopped")

try:
    with stopping_on_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        events.append("not interrupted")
except KeyboardInterrupt:
    events.append("interrupted")
with stopping_on_signals(lambda: events.append("stopped at the end")):
    events.append("ran")
print(events, (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before)
"""


def test_sigterm_interrupts_the_block_and_not_the_stop_and_the_handlers_come_back() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "['stopped', 'interrupted', 'ran', 'stopped at the end'] True\n"
