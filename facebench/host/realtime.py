"""Real-time scheduling for what stands in for something outside the host and sleeps more than it
works: the emulated bucket's relay.

It waits for moments (a first byte's, a paced chunk's) that a real bucket keeps whatever the host
is doing. Under the kernel's fair scheduler, a relay that wakes while the loader's workers fill
every core waits its turn: at 20 ms emulated, with another job beside the run, 30-66% of its
answers left late, and what was measured was the host's load, not the bucket. Under SCHED_RR it
runs the moment its time comes; it works little (about 0.4 ms of CPU a request), and the
kernel's real-time throttling (95% of each second by default) keeps it from starving the rest.

(The emulated accelerator's wait needs none of this: slept, it wakes on time on a busy host, as
the fair scheduler favours a thread that slept; spun, it stands for a training process's
spinning wait, which competes for the cores as any thread does: run/accelerator.py.)

Allowed to root, to a process with CAP_SYS_NICE, or under an RLIMIT_RTPRIO of at least
PRIORITY (`ulimit -r`). Elsewhere the job says so in one line, once, and what it costs.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

# Low among real-time priorities (1-99): above every ordinary thread, below the kernel's own.
PRIORITY = 10
_said = threading.Event()


def make_process_realtime() -> bool:
    """Put this process's thread, and every thread it starts after, under SCHED_RR: for a
    process all of whose threads stand in for something outside the host (the relay). Whether
    it was allowed; nothing is said here (the job that started the process says it)."""
    try:
        # Without SCHED_RESET_ON_FORK, which resets new threads too, not only processes (seen:
        # a thread started after it ran under SCHED_OTHER): the relay's timer thread must
        # inherit this. The relay starts no process.
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(PRIORITY))
    except OSError:  # PermissionError where neither root, CAP_SYS_NICE nor RLIMIT_RTPRIO allow
        return False
    # No RLIMIT_RTTIME: a relay kept busy by its clients polls without blocking for as long as
    # they keep it busy (storage_relay_cpu_frac near 1), which such a limit would kill.
    return True


def say_relay_not_realtime() -> None:
    """One line, once per process: the relay runs without real-time scheduling, what that
    costs, and how to allow it."""
    if _said.is_set():
        return
    _said.set()
    log.warning(
        "the emulated bucket's relay runs without real-time scheduling (not allowed to this "
        "process): while the loader fills the cores it answers late, and the run measures the "
        "host's load as much as the bucket (storage_relay_late_frac says how much). Allow it: "
        "ulimit -r %d before the run (its hard limit from rtprio in "
        "/etc/security/limits.conf), or in a container --ulimit rtprio=%d or "
        "--cap-add=SYS_NICE", PRIORITY, PRIORITY,
    )  # fmt: skip
