"""The metrics mean what they say: consistent, sensitive to a slow loader, honest on the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from facebench.data.synthetic import ensure_synthetic
from facebench.host.pagecache import evict, resident_fraction, warm
from facebench.loaders.shared import Batch
from facebench.measure.epoch_lines import summarise
from facebench.measure.meter import DeviceBusy, EpochMeter, EpochTimes
from facebench.measure.order import batch_label_diversity, expected_distinct_labels, order_corr
from facebench.run.epoch import EpochSettings, run_epoch
from facebench.run.runner import run_training

CPU = EpochSettings(torch.device("cpu"), sample_hz=0)


def _batches(n_batches: int, batch_size: int = 16):
    def build():
        for index in range(n_batches):
            ids = torch.arange(index * batch_size, (index + 1) * batch_size)
            yield Batch(torch.zeros(batch_size, 3, 8, 8), ids % 7, ids)

    return build


def test_metrics_are_consistent(make_cfg):
    metrics = run_training(make_cfg("loader=dataset", "n_workers=2"))
    assert metrics["images_per_s"] * metrics["epoch_time_s"] == pytest.approx(
        metrics["samples_seen"], rel=1e-6
    )
    assert metrics["samples_seen"] == metrics["batches"] * 8 == 120
    assert 0 <= metrics["data_wait_frac"] <= 1
    assert metrics["compute_s"] == pytest.approx(
        metrics["epoch_time_s"] - metrics["data_wait_s"], abs=1e-9
    )
    assert 0 < metrics["time_to_first_batch_s"] < metrics["epoch_time_s"]
    assert metrics["steady_images_per_s"] > 0
    assert 0 < metrics["cpu_util_mean"] <= 100
    assert metrics["peak_rss_mb"] > 50
    assert metrics["samples_unique"] == 120
    # No NVIDIA GPU here: GPU metrics are absent, never zeros.
    assert not any(name.startswith("gpu_") for name in metrics)


class FakeClock:
    """A clock the test moves: every duration the meter reports is set exactly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _timed(
    waits: list[float], step_s: float, batch_size: int = 16, in_flight: int = 0
) -> EpochTimes:
    """An epoch whose loader takes waits[i] for batch i and whose step takes step_s."""
    clock = FakeClock()
    meter = EpochMeter(torch.device("cpu"), clock=clock, in_flight=in_flight)
    meter.start()
    asked_at = meter.started_at
    for wait in waits:
        clock.now += wait
        meter.batch(asked_at, batch_size)
        clock.now += step_s
        asked_at = meter.now()
    return meter.stop()


def test_a_slow_loader_shows_as_data_wait():
    fast = _timed([0.001] * 10, step_s=0.01)
    slow = _timed([0.03] * 10, step_s=0.01)
    assert slow.data_wait_s == pytest.approx(0.3)
    assert slow.epoch_time_s == pytest.approx(0.4)
    assert slow.data_wait_frac == pytest.approx(0.75)
    assert fast.data_wait_frac == pytest.approx(0.01 / 0.11)
    assert slow.images_per_s == pytest.approx(160 / 0.4)


def test_steady_rate_leaves_out_the_warmup():
    # A loader slow only for its first batch (worker start-up): the steady rate must not see it.
    times = _timed([0.2] + [0.01] * 19, step_s=0.01)
    assert times.warmup_batches == 2
    assert times.time_to_first_batch_s == pytest.approx(0.2)
    # Batches 2..19 arrived in the 18 cycles (step, then wait) after batch 1 arrived.
    assert times.steady_images_per_s == pytest.approx(18 * 16 / (18 * 0.02))
    # The whole epoch: the slow first batch and its step, then 19 cycles.
    assert times.images_per_s == pytest.approx(20 * 16 / (0.2 + 0.01 + 19 * 0.02))


def test_the_batches_made_at_the_start_are_warm_up_and_too_few_after_them_give_no_rate():
    # Five workers, two batches ahead each, start together: ten batches arrive a moment apart.
    together = _timed([1.5] + [0.0001] * 9, step_s=0.0, in_flight=10)
    assert together.warmup_batches == 9  # all but the last: one batch must follow
    assert not together.steady_measured
    assert "steady_images_per_s" not in together.metrics()
    # Five batches made at the start, then a second round: that round is the steady part.
    rounds = _timed([1.5] + [0.0001] * 4 + [0.5] + [0.0001] * 4, step_s=0.0, in_flight=5)
    assert rounds.warmup_batches == 5 and rounds.steady_measured
    assert rounds.metrics()["steady_images_per_s"] == pytest.approx(5 * 16 / (0.5 + 4 * 0.0001))
    # The rate a caller takes: the steady one where measured; else the whole epoch's, never the
    # moment between two batches made before the first arrived (advise once chose a loader on
    # "128,851 images/s" from a bucket, two batches of 600).
    assert rounds.rate == rounds.steady_images_per_s
    assert together.rate == together.images_per_s == pytest.approx(10 * 16 / (1.5 + 9 * 0.0001))
    assert together.steady_images_per_s > 100 * together.rate  # what was once taken


def test_the_default_run_has_no_steady_rate_and_its_log_line_does_not_mention_one(caplog):
    # python train.py: 10 batches of 600, 5 workers x prefetch 2 = all 10 made at the start.
    import logging

    from facebench.measure.epoch_lines import log_epoch
    from facebench.measure.meter import batches_for_steady

    default = _timed([1.5] + [0.0001] * 9, step_s=0.01, in_flight=10)
    assert not default.steady_measured
    # The fewest batches that give one, and the meter agrees on either side of it.
    assert batches_for_steady(10) == 15
    assert _timed([0.01] * 15, step_s=0.01, in_flight=10).steady_measured
    assert not _timed([0.01] * 14, step_s=0.01, in_flight=10).steady_measured
    metrics = {**default.metrics(), "cpu_util_mean": 90.0}
    with caplog.at_level(logging.DEBUG, logger="facebench"):
        log_epoch(0, metrics, in_flight=10)
    said = {record.levelno: record.getMessage() for record in caplog.records}
    assert said[logging.INFO].startswith("epoch 0: 160 images in ")
    assert "steady" not in said[logging.INFO]
    assert said[logging.DEBUG] == (
        "epoch 0: no steady rate: 9 of its 10 batches were warm-up (a tenth of the epoch, and "
        "at least the 10 that n_workers x prefetch_factor start on at once), and a steady rate "
        "needs 5 after the warm-up: 15 batches or more (a larger data.n_images or a smaller "
        "batch_size)"
    )
    caplog.clear()
    steady = _timed([0.01] * 20, step_s=0.01, in_flight=2)
    with caplog.at_level(logging.DEBUG, logger="facebench"):
        log_epoch(1, {**steady.metrics(), "cpu_util_mean": 90.0}, in_flight=2)
    [line] = caplog.messages
    assert f"images/s (steady {steady.steady_images_per_s:,.1f}); first batch" in line


def test_max_batches_stops_the_epoch():
    result = run_epoch(
        _batches(10), None, EpochSettings(torch.device("cpu"), max_batches=3, sample_hz=0)
    )
    assert result.times.batches == 3 and result.times.samples_seen == 48


def test_cold_evicts_and_warm_reads_in(tmp_path):
    # Files of its own: another test reading the shared set would read them back in.
    root = ensure_synthetic(tmp_path, n_images=120, seed=0, n_procs=1)
    files = sorted(str(p) for p in (root / "DigiFace1M").rglob("*.png"))[:40]
    warm(files)
    assert resident_fraction(files) == pytest.approx(1.0)
    evict(files)
    assert resident_fraction(files) < 0.05
    warm(files)
    assert resident_fraction(files) == pytest.approx(1.0)


@pytest.mark.parametrize(("cache_mode", "resident"), [("cold", 0.0), ("warm", 1.0)])
def test_runs_record_the_cache_state_they_ran_in(make_cfg, tmp_path, cache_mode, resident):
    # A set of its own: another test reading the shared one between the eviction and the
    # measurement brings its files back into the page cache (11% resident, once).
    cfg = make_cfg(f"cache={cache_mode}", "max_batches=1", cache_dir=tmp_path)
    metrics = run_training(cfg)
    assert metrics["cache_resident_frac"] == pytest.approx(resident, abs=0.05)


def test_order_metrics_tell_a_shuffle_from_none():
    rng = np.random.default_rng(0)
    n = 5000
    shuffled = rng.permutation(n)
    assert order_corr(shuffled) < 0.05
    assert order_corr(np.arange(n)) == pytest.approx(1.0)
    assert order_corr(np.arange(n)[::-1]) == pytest.approx(1.0)
    labels = np.repeat(np.arange(250), 20)  # identities grouped, as files on disk are
    counts = np.bincount(labels)
    batches = [labels[shuffled][i : i + 50] for i in range(0, n, 50)]
    grouped = [labels[i : i + 50] for i in range(0, n, 50)]
    assert batch_label_diversity(batches, counts) == pytest.approx(1.0, abs=0.03)
    assert batch_label_diversity(grouped, counts) < 0.1


def test_expected_distinct_labels_matches_simulation():
    counts = np.array([1, 5, 20, 74])
    rng = np.random.default_rng(1)
    population = np.repeat(np.arange(4), counts)
    simulated = np.mean([len(set(rng.choice(population, 10, replace=False))) for _ in range(4000)])
    assert expected_distinct_labels(counts, 10) == pytest.approx(simulated, abs=0.05)


def test_the_dataset_loader_shuffles(make_cfg):
    metrics = run_training(make_cfg("loader=dataset"))
    assert metrics["order_corr"] < 0.3  # 120 samples: chance level is about 0.09
    assert metrics["batch_label_diversity"] > 0.8


def test_repeat_logs_medians(make_cfg):
    metrics = run_training(make_cfg("repeat=3", "max_batches=2"))
    assert metrics["measured_epochs"] == 3
    assert metrics["epoch_time_s_min"] <= metrics["epoch_time_s_median"]
    assert metrics["epoch_time_s_median"] <= metrics["epoch_time_s_max"]


def test_summarise_takes_medians():
    summary = summarise([{"epoch_time_s": t} for t in (3.0, 1.0, 2.0)])
    assert summary["epoch_time_s_median"] == 2.0
    assert (summary["epoch_time_s_min"], summary["epoch_time_s_max"]) == (1.0, 3.0)


@pytest.mark.slow
def test_compute_ceiling_loader_runs_without_files(make_cfg):
    metrics = run_training(make_cfg("loader=ceiling", "model=resnet18", "amp=off"))
    assert metrics["samples_seen"] == 120
    assert "order_corr" not in metrics  # no real samples to order
    assert "cache_resident_frac" not in metrics


class _FakeEvent:
    """A CUDA event's timing interface, on a clock the test sets."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def record(self) -> None:
        self.at = self.clock[0]

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.at - self.at) * 1000.0  # milliseconds, as CUDA reports


def test_device_busy_adds_up_the_steps_it_timed():
    clock = [0.0]
    busy = DeviceBusy("cuda", new_event=lambda: _FakeEvent(clock))
    for start, length in [(0.0, 0.25), (1.0, 0.5), (3.0, 0.25)]:  # idle gaps between steps
        clock[0] = start
        with busy.step():
            clock[0] = start + length
    metrics = busy.metrics(epoch_time_s=4.0)
    assert metrics["gpu_busy_s"] == pytest.approx(1.0)
    assert metrics["gpu_busy_frac"] == pytest.approx(0.25)
    assert metrics["gpu_idle_s"] == pytest.approx(3.0)
    assert DeviceBusy(torch.device("cpu")).metrics(4.0) == {}  # no CUDA: nothing recorded


def test_host_only_hands_batches_over_unfinished():
    # uint8 batches whose crop offsets lie outside the image: finishing them would fail.
    def build():
        for index in range(3):
            ids = torch.arange(index * 4, index * 4 + 4)
            images = torch.zeros(4, 112, 112, 3, dtype=torch.uint8)
            yield Batch(images, ids % 3, ids, torch.full((4, 2), 500))

    result = run_epoch(build, None, EpochSettings(torch.device("cpu"), sample_hz=0, host_only=True))
    assert result.times.samples_seen == 12
    with pytest.raises((RuntimeError, ValueError, IndexError)):
        run_epoch(build, None, CPU)
