"""The processes facebench starts with exec: a group of their own, dying with their parent
where asked, waited for with a deadline, ended by group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from facebench.host.children import alive, end_groups, spawn

# A child that starts a grandchild in its own group, prints both pids, then sleeps; with
# "stubborn" both ignore SIGTERM.
_FAMILY = """
import signal, subprocess, sys, time
if "stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grand = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
    + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" if "stubborn" in sys.argv else "")
    + "time.sleep(60)"])
print(grand.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_child_leads_its_own_group_and_ends_with_everything_in_it():
    child = spawn([sys.executable, "-c", _FAMILY], stdin=subprocess.DEVNULL)
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    assert os.getsid(child.pid) == child.pid  # a Ctrl-C to this terminal does not reach it
    assert child.wait(0.2) is None  # still running: the deadline passed, nothing ended
    child.end(grace_s=5)
    assert child.process.returncode == -signal.SIGTERM


@pytest.mark.parametrize("stubborn", [False, True], ids=["leaves", "ignores-sigterm"])
def test_ending_a_group_reaches_the_grandchild_and_keeps_its_deadline(tmp_path, stubborn):
    log = tmp_path / "child.log"
    child = spawn(
        [sys.executable, "-c", _FAMILY, *(["stubborn"] if stubborn else [])], log_path=log
    )
    deadline = time.monotonic() + 20
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(log.read_text().split()[0])
    started = time.monotonic()
    end_groups([child.pid], grace_s=1.0)
    took = time.monotonic() - started
    child.process.wait(timeout=5)
    assert _gone(grandchild), "the grandchild outlived its group's end"
    # SIGTERM answered at once; ignored, SIGKILL once the grace has passed, not before.
    assert child.process.returncode == (-signal.SIGKILL if stubborn else -signal.SIGTERM)
    assert (took >= 1.0) if stubborn else (took < 1.0), took


# A parent that spawns a sleeping child, prints its pid, and waits to be killed.
_PARENT = """
import sys, time
from facebench.host.children import spawn
child = spawn([sys.executable, "-c", "import time; time.sleep(60)"],
              dies_with_parent=sys.argv[1] == "dies")
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("dies", [True, False], ids=["dies-with-parent", "detached"])
def test_a_child_dies_with_its_parent_unless_detached(dies):
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, "dies" if dies else "stays"], stdout=subprocess.PIPE
    )
    child = int(parent.stdout.readline())
    parent.kill()  # outright: no handler of the parent's runs
    parent.wait()
    try:
        assert _gone(child, within_s=10.0 if dies else 2.0) is dies
    finally:
        if alive(child):
            psutil.Process(child).kill()
