"""Progress without a terminal: a log line at a steady interval, for generation, shards, epochs."""

from __future__ import annotations

import logging
import time

from facebench.host import progress as progress_module
from facebench.host.progress import ProgressLog, progress
from facebench.run.runner import run_training


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_interval_with_done_rate_and_time_left(caplog):
    clock = FakeClock()
    log = logging.getLogger("test.progress")
    lines = ProgressLog(1000, "epoch 1/1", "images", log, every_s=30, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.progress"):
        for _ in range(10):
            clock.now += 10  # 100 images every 10 s
            lines.update(100)
        lines.close()
    messages = [record.getMessage() for record in caplog.records]
    # At 30, 60 and 90 s, and the last word at the end.
    assert messages[:3] == [
        "epoch 1/1: 300 images of 1,000 (30%), 10.0 images/s, 30 s so far, about 70 s left",
        "epoch 1/1: 600 images of 1,000 (60%), 10.0 images/s, 60 s so far, about 40 s left",
        "epoch 1/1: 900 images of 1,000 (90%), 10.0 images/s, 90 s so far, about 10 s left",
    ]
    assert messages[3] == "epoch 1/1: 1,000 images of 1,000 (100%), 10.0 images/s, 100 s so far"
    assert len(messages) == 4


def test_short_work_logs_nothing_and_unknown_totals_log_no_time_left(caplog):
    clock = FakeClock()
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        quick = ProgressLog(10, "quick", "images", log, every_s=30, clock=clock)
        clock.now = 5
        quick.update(10)
        quick.close()
        assert caplog.records == []
        open_ended = ProgressLog(None, "epoch", "images", log, every_s=30, clock=clock)
        clock.now = 4000
        open_ended.update(7200)
    assert caplog.records[0].getMessage() == "epoch: 7,200 images, 1.8 images/s, 67 min so far"


def test_progress_logs_lines_when_stderr_is_not_a_terminal(monkeypatch, caplog):
    # Under pytest stderr is captured: not a terminal, as in CI or a log file.
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO):
        assert list(progress(range(3), 3, "writing shards", "shards")) == [0, 1, 2]
    assert "writing shards: 3 shards of 3 (100%)" in caplog.text


def test_an_epoch_logs_its_progress_to_a_file(make_cfg, monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO):
        run_training(make_cfg("loader=dataset"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 1/1: ")]
    assert lines, caplog.text
    assert lines[-1].startswith("epoch 1/1: 120 images of 120 (100%)")


def test_a_batch_longer_than_the_interval_still_gets_its_lines(caplog):
    """ResNet-50 on a CPU takes about a minute a batch: lines come every interval anyway, and
    stop when the epoch does."""
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        lines = ProgressLog(1000, "epoch 1/1", "images", log, every_s=0.2, heartbeat=True)
        lines.update(100)
        time.sleep(1.0)  # one long batch: no update
        during = len(caplog.records)
        lines.close()
        time.sleep(0.5)
    messages = [record.getMessage() for record in caplog.records]
    assert during >= 2, messages
    assert all(m.startswith("epoch 1/1: 100 images of 1,000 (10%)") for m in messages)
    assert len(messages) == during  # nothing after close: the last line already said 100
