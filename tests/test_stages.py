"""Stage times: each thread's tally, the loop's timeline, and that a run's stages add up."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from facebench import loaders, stages
from facebench.loaders.shared import Batch
from facebench.measure.timeline import LoopTimeline
from facebench.run.runner import run_training
from facebench.stages import MAIN_STAGES, WORKER_STAGES, StageTimes, StageTotals
from tests.helpers import LOADERS


@pytest.fixture(autouse=True)
def _timing_on():
    stages.begin_epoch(True)
    yield
    stages.begin_epoch(True)


def _busy(seconds: float) -> None:
    """Work until this thread has used `seconds` of CPU time: as long in wall time or longer,
    however busy the machine."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_take_holds_this_threads_stages_since_its_last_take():
    start = stages.now()
    _busy(0.02)
    start = stages.lap(stages.DECODE, start)
    _busy(0.01)
    stages.lap(stages.COLLATE, start)
    first = stages.take()
    assert first is not None
    read, decode, load, transform, collate = first.ns
    assert read == load == transform == 0
    assert decode >= 0.02e9 and collate >= 0.01e9
    # CPU time: the work itself, never more than the wall time it took (but for the
    # microsecond between reading one clock and the other).
    cpu_read, cpu_decode, cpu_load, cpu_transform, cpu_collate = first.stage_cpu_ns
    assert cpu_read == cpu_load == cpu_transform == 0
    assert 0.02e9 <= cpu_decode <= decode + 1e6 and 0.01e9 <= cpu_collate <= collate + 1e6
    # The thread's CPU time since the epoch began (not since it started): the 30 ms of work,
    # and no more than the wall time that passed.
    assert 0.03e9 <= first.cpu_ns <= decode + collate + 0.05e9
    second = stages.take()
    assert second is not None and second.ns == (0, 0, 0, 0, 0)


def test_each_thread_keeps_its_own_tally():
    results: dict[str, StageTimes | None] = {}

    def work(name: str, stage: int, seconds: float) -> None:
        start = stages.now()
        _busy(seconds)
        stages.lap(stage, start)
        results[name] = stages.take()

    threads = [
        threading.Thread(target=work, args=("a", stages.READ, 0.01)),
        threading.Thread(target=work, args=("b", stages.TRANSFORM, 0.01)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    a, b = results["a"], results["b"]
    assert a is not None and b is not None
    assert a.ns[stages.READ] > 0 and a.ns[stages.TRANSFORM] == 0
    assert b.ns[stages.TRANSFORM] > 0 and b.ns[stages.READ] == 0
    assert a.producer != b.producer


def test_timing_off_takes_nothing():
    stages.begin_epoch(False)
    stages.lap(stages.READ, stages.now())
    assert stages.take() is None


def test_a_stage_that_waits_costs_its_cpu_time_only():
    """Sleeping inside a stage (as a worker waits for a core, or for storage) is wall time,
    not CPU time: CPU time is what the stage costs, the rest is the wait."""
    start = stages.now()
    _busy(0.01)
    time.sleep(0.05)
    stages.lap(stages.READ, start)
    times = stages.take()
    assert times is not None
    assert times.ns[stages.READ] >= 0.06e9
    assert 0.01e9 <= times.stage_cpu_ns[stages.READ] < 0.04e9
    totals = StageTotals()
    totals.add_batch(times)
    metrics = totals.metrics(images=1, epoch_time_s=1.0)
    assert metrics["stage_waited_us"] == pytest.approx(
        (times.ns[stages.READ] - times.stage_cpu_ns[stages.READ]) / 1e3
    )
    assert metrics["stage_waited_us"] >= 0.03e6


def _child(queue) -> None:
    start = stages.now()
    _busy(0.01)
    stages.lap(stages.DECODE, start)
    queue.put(stages.take())


def test_a_forked_worker_counts_its_own_work_and_its_process_cpu_time():
    # The parent's tally, left untaken, must not reach the child.
    wall, cpu = stages.now()
    stages.lap(stages.READ, (wall - 10**9, cpu - 10**9))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue,))
    child.start()
    times = queue.get(timeout=30)
    child.join(timeout=30)
    assert times.ns[stages.READ] == 0
    assert times.ns[stages.DECODE] >= 0.01e9
    assert times.cpu_ns >= 0.01e9  # the process's CPU time since it was forked
    assert times.producer[0] == child.pid


class _FakeClocks:
    """Wall and CPU clocks a test moves by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def advance(self, wall: float, cpu: float = 0.0) -> None:
        self.wall += wall
        self.cpu += cpu


def _timeline(clocks: _FakeClocks, totals: StageTotals) -> LoopTimeline:
    return LoopTimeline(totals, 0.0, clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu)


def test_the_loop_timeline_gives_every_moment_to_one_stage():
    clocks, totals = _FakeClocks(), StageTotals()
    timeline = _timeline(clocks, totals)
    times = StageTimes((1000, 2000, 0, 3000, 4000), (1000, 2000, 0, 3000, 4000), 12_000, (-1, -1))

    def loader():
        clocks.advance(0.9, cpu=0.1)  # blocked 0.8 s on the workers, 0.1 s receiving
        yield Batch(None, None, None, stages=times)
        clocks.advance(0.5, cpu=0.2)
        yield Batch(None, None, None, stages=None)
        clocks.advance(0.05)  # the loader's end

    clocks.advance(0.3)  # building the loader
    batches = timeline.measured(loader())
    timeline.mark("wait")
    for _ in batches:
        timeline.arrived("finish")
        clocks.advance(0.25)
        timeline.mark("step")
    clocks.advance(0.1)  # the device's queued work, at the clock's stop
    timeline.close(clocks.wall, "step")
    main = totals.main_s
    assert main["wait"] == pytest.approx(0.3 + 0.8 + 0.3 + 0.05)
    assert main["handover"] == pytest.approx(0.1 + 0.2)
    assert main["step"] == pytest.approx(2 * 0.25 + 0.1)
    assert main["finish"] == pytest.approx(0.0)
    assert sum(main.values()) == pytest.approx(clocks.wall)
    assert totals.worker_ns == [1000, 2000, 0, 3000, 4000] and totals.timed_batches == 1


def test_a_batch_loaded_in_the_loops_own_thread_is_wait_not_handover():
    clocks, totals = _FakeClocks(), StageTotals()
    timeline = _timeline(clocks, totals)
    me = LoopTimeline(totals, 0.0)._me
    # n_workers=0: the loop's thread spent 0.7 s of CPU loading the batch, 0.6 s of it in stages.
    stage_ns = (int(0.2e9), int(0.4e9), 0, 0, 0)
    times = StageTimes(stage_ns, stage_ns, int(0.7e9), me)

    def loader():
        clocks.advance(0.7, cpu=0.7)
        yield Batch(None, None, None, stages=times)

    for _ in timeline.measured(loader()):
        timeline.arrived("handover")
    timeline.close(clocks.wall, "handover")
    assert totals.main_s["handover"] == pytest.approx(0.1)
    assert totals.main_s["wait"] == pytest.approx(0.6)


def test_stage_metrics_are_per_image_and_shares():
    totals = StageTotals()
    # Wall: decode 300 us of 500 us; CPU: read 80, decode 100, collate 100 (transform waited).
    wall, cpu = (100_000, 300_000, 0, 0, 100_000), (80_000, 100_000, 0, 0, 100_000)
    totals.add_batch(StageTimes(wall, cpu, 500_000, (1, 1)))
    totals.main_s.update(wait=0.3, handover=0.1, finish=0.0, step=0.6)
    metrics = totals.metrics(images=10, epoch_time_s=1.0)
    assert metrics["stage_decode_us"] == pytest.approx(30.0)
    assert metrics["stage_decode_frac"] == pytest.approx(0.6)
    assert metrics["stage_decode_cpu_us"] == pytest.approx(10.0)
    assert metrics["stage_read_cpu_frac"] == pytest.approx(80 / 280)
    assert metrics["stage_waited_us"] == pytest.approx((500 - 280) / 10)
    assert metrics["stage_worker_coverage"] == pytest.approx(1.0)
    assert metrics["stage_step_frac"] == pytest.approx(0.6)
    assert metrics["stage_wait_us"] == pytest.approx(30_000.0)
    # The costliest stage by CPU time: decode and collate tie, decode comes first; by wall
    # time, decode alone.
    assert stages.dominant(metrics) == "decode"
    assert stages.dominant_label(metrics) == "decode 36%"
    cpu_only = dict(metrics, stage_collate_cpu_frac=0.5)
    assert stages.dominant(cpu_only) == "collate"
    assert "read 8 us, decode 10 us, transform 0 us, collate 10 us" in stages.describe(metrics)
    assert "waiting for a core or storage: 22 us" in stages.describe(metrics)
    # No batch carried stage times: the worker side is not broken down.
    empty = StageTotals()
    empty.main_s.update(wait=1.0)
    bare = empty.metrics(images=10, epoch_time_s=1.0)
    assert "stage_read_us" not in bare and stages.dominant(bare) is None
    assert bare["stage_main_coverage"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", LOADERS)
def test_every_loader_logs_its_stages(make_cfg, name):
    metrics = run_training(
        make_cfg(f"loader={name}", "host_only=true", "n_workers=2", "batch_size=8", "shard_size=32")
    )
    for stage in MAIN_STAGES:
        assert f"stage_{stage}_us" in metrics
    assert metrics["stage_main_coverage"] == pytest.approx(1.0, abs=0.05)
    if not loaders.get(name).stage_times:
        assert "stage_read_us" not in metrics
        return
    assert all(f"stage_{stage}_frac" in metrics for stage in WORKER_STAGES)
    # Every loader gets bytes and assembles batches; the shares add up to the whole.
    assert metrics["stage_read_us"] > 0 and metrics["stage_collate_us"] > 0
    assert sum(metrics[f"stage_{s}_frac"] for s in WORKER_STAGES) == pytest.approx(1.0)


def test_stage_times_false_times_nothing(make_cfg):
    metrics = run_training(make_cfg("loader=dataset", "n_workers=2", "stage_times=false"))
    assert not [name for name in metrics if name.startswith("stage_")]


@pytest.mark.parametrize("name", ["dataset", "nodes"])
def test_stages_add_up_to_the_workers_cpu_time_and_the_epoch(make_cfg, name):
    # Two kinds of worker processes: DataLoader's and torchdata.nodes'. CPU time with CPU
    # time, wall time with wall time: neither sum moves when other work shares the cores (a
    # stage's wall time does: it then waits for a core). Enough images that a worker's
    # start-up (a few ms of CPU time in no stage) is not a tenth of its work.
    metrics = run_training(
        make_cfg(
            f"loader={name}", "host_only=true", "n_workers=2", "batch_size=20", "data.n_images=600"
        )
    )
    # The stages are part of what the workers did: most of it. The rest is a worker's loop and
    # handing each batch over (pickled by the queue's feeder thread): about 10% for DataLoader's
    # workers and 20% for nodes' here, quiet or loaded.
    in_stages = sum(metrics[f"stage_{stage}_cpu_us"] for stage in WORKER_STAGES)
    assert 0.7 * metrics["stage_worker_cpu_us"] <= in_stages <= metrics["stage_worker_cpu_us"]
    wall = sum(metrics[f"stage_{stage}_us"] for stage in WORKER_STAGES)
    assert wall == pytest.approx(in_stages + metrics["stage_waited_us"], rel=1e-6)
    main = sum(metrics[f"stage_{stage}_us"] for stage in MAIN_STAGES) / 1e6
    assert main * metrics["samples_seen"] == pytest.approx(metrics["epoch_time_s"], rel=0.05)
    # Decoding and transforming a PNG or JPEG costs more than reading it from a warm cache.
    assert metrics["stage_decode_cpu_us"] > metrics["stage_read_cpu_us"]


def test_the_report_shows_each_loaders_stages_with_the_costliest_in_bold(tmp_path):
    from facebench.report.chart import chart
    from facebench.report.markdown import render
    from facebench.report.sweep_table import Cell

    decoding = {"read": 40.0, "decode": 600.0, "transform": 350.0, "collate": 70.0}
    table = {
        2: {
            "dataset": Cell(10.0, 1000.0, 1, decoding, waited_us=1234.0),
            "raw": Cell(0.5, 20000.0, 1, {"read": 30.0, "collate": 2.0}),
            "dali": Cell(2.0, 5000.0, 1),  # not broken down: no row
        }
    }
    text = render((("model", "none"),), table)
    assert "| dataset | 2 | 40 | **600** | 350 | 70 | 1,234 |" in text
    assert "| raw | 2 | **30** | 0 | 0 | 2 | - |" in text
    assert "| dali |" not in text.split("Where each image's time went")[1]
    chart({(("model", "none"),): table}, tmp_path / "report.png", with_article=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_report_shows_a_custom_loaders_load_stage_and_transforms_by_name(tmp_path):
    from facebench.report.chart import chart
    from facebench.report.markdown import render
    from facebench.report.sweep_table import Cell

    own = {"load": 650.0, "transform": 1400.0, "collate": 120.0}
    table = {
        2: {
            "custom": Cell(7.0, 870.0, 1, own, parts=[("ColorJitter", 0.27), ("Flip", 0.03)]),
            "raw": Cell(0.5, 20000.0, 1, {"read": 30.0, "collate": 2.0}),
        }
    }
    text = render((("model", "none"),), table)
    assert "| loader | n workers | read | decode | load | transform | collate | waited |" in text
    assert "| custom | 2 | 0 | 0 | 650 | **1,400** | 120 | - |" in text
    assert "- custom, 2 workers: ColorJitter 27%, Flip 3%" in text
    chart({(("model", "none"),): table}, tmp_path / "report.png", with_article=False)
    assert (tmp_path / "report.png").stat().st_size > 10_000
