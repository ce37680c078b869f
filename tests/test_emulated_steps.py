"""An emulated accelerator's steps: the host CPU they charge (accelerator.host_cpu), and when the
loop waits for them (accelerator.sync), on a clock the test moves, then on the real one."""

from __future__ import annotations

import threading
import time

import pytest

from facebench.config import Sync
from facebench.report import hosts_fed
from facebench.run.accelerator import Accelerator, EmulatedSteps, spin
from facebench.run.runner import run_training


class _Clock:
    """A clock that moves only when the code under test sleeps or spins, or the test says."""

    def __init__(self) -> None:
        self.now = 0.0
        self.spun: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def busy(self, seconds: float) -> None:
        self.spun.append(seconds)
        self.now += seconds


def _steps(clock: _Clock, **kinds) -> EmulatedSteps:
    # 100 images/s: a batch of 10 is a step of 0.1 s.
    accelerator = Accelerator("x", images_per_s=100.0, min_au=0.9, source="", **kinds)
    return EmulatedSteps(accelerator, clock=clock, sleep=clock.sleep, busy=clock.busy)


def test_every_step_spins_the_host_share_of_each_step_and_sleeps_the_rest():
    clock = _Clock()
    steps = _steps(clock, host_cpu=0.25)
    for _ in range(4):
        steps.step(10)
        clock.now += 0.05  # the loop's own work, then the loader's next batch
    assert clock.spun == pytest.approx([0.025] * 4)
    metrics = steps.metrics(epoch_end=clock.now)
    assert metrics["accelerator_host_cpu_s"] == pytest.approx(0.1)
    # The loop's 50 ms after each step is time the accelerator sat idle: 3 steps in the 0.5 s
    # after the first step's end.
    assert metrics["au"] == pytest.approx(0.3 / 0.5)


def test_an_idle_host_spins_nothing():
    clock = _Clock()
    steps = _steps(clock, host_cpu=0.0)
    steps.step(10)
    steps.step(10)
    assert clock.spun == [] and clock.now == pytest.approx(0.2)


def test_without_sync_the_loop_works_while_the_step_computes():
    """sync=none: the loop's 50 ms between steps overlaps the 100 ms step; it waits only once
    two steps are launched and not finished, and the epoch's end waits for the last."""
    clock = _Clock()
    steps = _steps(clock, host_cpu=1.0, sync=Sync.none, queue=2)
    for _ in range(10):
        steps.step(10)
        clock.now += 0.05
    steps.finish()
    metrics = steps.metrics(epoch_end=clock.now)
    assert metrics["au"] == pytest.approx(1.0)
    assert clock.now == pytest.approx(1.0)  # ten steps back to back: the loop never held it
    # The waits were spun (host_cpu 1): the loop's 0.5 s of its own work was not.
    assert metrics["accelerator_host_cpu_s"] == pytest.approx(1.0 - 0.5)


def test_without_sync_a_slow_loader_still_leaves_the_accelerator_idle():
    clock = _Clock()
    steps = _steps(clock, host_cpu=0.0, sync=Sync.none, queue=2)
    for _ in range(5):
        steps.step(10)
        clock.now += 0.2  # the loader takes twice the step's time
    steps.finish()
    metrics = steps.metrics(epoch_end=clock.now)
    # Steps 2-5 (0.4 s computed) over the 0.9 s from the first step's end (0.1 s) to the
    # epoch's end (1.0 s: the loader's last 0.2 s included).
    assert metrics["au"] == pytest.approx(0.4 / 0.9)


def test_the_queue_bounds_how_far_the_loop_runs_ahead():
    clock = _Clock()
    steps = _steps(clock, sync=Sync.none, queue=1, host_cpu=0.0)
    steps.step(10)
    assert clock.now == 0.0  # one step launched: the loop goes on at once
    steps.step(10)
    assert clock.now == pytest.approx(0.1)  # a second: it waits for the first to finish
    steps.finish()
    assert clock.now == pytest.approx(0.2)


@pytest.mark.alone
def test_spinning_burns_this_core_and_leaves_the_gil_to_other_threads():
    """What host_cpu stands for: CUDA's wait keeps a core busy in C, while the process's other
    threads (a thread-based loader's) run Python beside it."""
    counted = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counted
        while not stop.is_set():
            counted += 1

    other = threading.Thread(target=count)
    other.start()
    cpu, wall = time.thread_time(), time.perf_counter()
    try:
        spin(0.3)
    finally:
        stop.set()
        other.join()
    spun = time.thread_time() - cpu
    assert time.perf_counter() - wall >= 0.3
    asleep = time.thread_time()
    time.sleep(0.3)
    slept = time.thread_time() - asleep
    # Busy, not asleep, though another thread wanted the GIL all along. How much of a core the
    # spin gets depends on what else the machine runs (a quarter of one, with both cores
    # loaded beside the suite): held against the same wait slept, not against the clock.
    assert spun >= 0.03 and spun > 20 * slept, (spun, slept)
    assert counted > 0  # and that thread ran meanwhile


@pytest.mark.alone
@pytest.mark.slow  # 6,000 images, as the ceiling's AU tests in tests/test_accelerators.py
def test_the_ceiling_keeps_an_h100_busy_at_small_batches_without_sync(make_cfg, default_size_root):
    """The ceiling loader hands batches over at once: with sync=none the loop's own work per
    step (handover, bookkeeping, a late wake-up) overlaps the step, as on a GPU, and AU reaches
    0.99 at batch 100 (11 ms steps)."""
    metrics = run_training(
        make_cfg(
            "loader=ceiling",
            "accelerator=h100",
            "accelerator.sync=none",
            "data.n_images=6000",
            "batch_size=100",
        )
    )
    assert metrics["au"] >= 0.99
    assert metrics["accelerator_host_cpu_s"] > 0  # the default host_cpu (1) was spun


def test_a_sweep_over_the_hosts_share_gives_each_share_its_own_line():
    """host_cpu 0 and 1 in one sweep are two questions (DLIO's idle host, a GPU run's): their
    runs are not mixed into one count of accelerators fed."""

    def run(count: int, au: float, host_cpu: float) -> dict:
        params = {
            "loader": "raw",
            "n_workers": 1,
            "accelerator.name": "h100",
            "accelerator_images_per_s": 8960.0,
            "accelerators_per_host": count,
            "accelerator.min_au": 0.9,
            "accelerator.host_cpu": host_cpu,
            "accelerator.sync": "every_step",
        }
        return {"params": params, "metrics": {"au": au, "au_pass": float(au >= 0.9)}, "tags": {}}

    lines = hosts_fed.lines([run(1, 0.95, 0.0), run(2, 0.92, 0.0), run(1, 0.93, 1.0)])
    assert len(lines) == 2
    idle, spinning = sorted(lines, key=lambda line: "host_cpu 0" not in line)
    assert "[host_cpu 0, sync every_step]" in idle and "feeds 2 h100" in idle
    assert "host_cpu" not in spinning and "feeds 1 h100" in spinning
