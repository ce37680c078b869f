"""`watch(loader)` in a user's own loop: batches unchanged, every way a loop ends recorded with
its status, the script's own MLflow run kept, a store that does not answer, several epochs,
the loader as it was afterwards, an IterableDataset and a plain generator."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
from pathlib import Path

import mlflow
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from facebench import watch
from facebench.custom.carrier import Carrier
from facebench.watching.gpu_wait import GpuWait
from tests.own_pipelines import Numbers, image_folder, write_folder


class Squares(Dataset):
    """Sample i: an image whose pixels are i, label i % 3."""

    def __init__(self, n: int = 40, fail_at: int = -1) -> None:
        self.n, self.fail_at = n, fail_at
        self.transform = torch.neg

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if index == self.fail_at:
            raise KeyError(f"sample {index} is missing")
        return self.transform(torch.full((3, 4, 4), float(index))), index % 3


def _loader(n_workers: int = 0, **kwargs) -> DataLoader:
    generator = torch.Generator().manual_seed(7)
    dataset = kwargs.pop("dataset", None) or Squares()
    return DataLoader(
        dataset, batch_size=4, shuffle=True, num_workers=n_workers, generator=generator, **kwargs
    )


@pytest.fixture
def store(tmp_path, empty_store, monkeypatch):
    """A private MLflow store for the watched runs (and the script's own)."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    with _tracking_at(f"sqlite:///{tmp_path / 'mlflow.db'}", monkeypatch) as uri:
        yield uri


@contextlib.contextmanager
def _tracking_at(uri: str, monkeypatch):
    """MLflow's store `uri`, as the environment and as the process's own setting: an earlier
    test in this process (a train.py job run in it) may have set another, which a script's
    setting is, and watch follows it."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(before)


@pytest.fixture
def pythons_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt), whatever an earlier test in this process
    left installed; the earlier one back afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _run(uri: str, results: dict):
    return mlflow.MlflowClient(uri).get_run(results["run_id"])


@pytest.mark.parametrize("n_workers", [0, 2])
def test_batches_are_the_same_with_and_without_watch(tmp_path, n_workers):
    plain = [batch for batch in _loader(n_workers)]
    watched = [batch for batch in watch(_loader(n_workers), tracking=False, folder=tmp_path)]
    assert len(plain) == len(watched) == 10
    for (images, labels), (seen_images, seen_labels) in zip(plain, watched, strict=True):
        assert torch.equal(images, seen_images) and torch.equal(labels, seen_labels)
    metrics = _results(tmp_path)["epochs"][0]
    assert metrics["samples_seen"] == 40 and metrics["batches"] == 10
    assert metrics["stage_load_us"] > 0 and metrics["part_neg_us"] > 0  # inside the workers


def test_a_generators_items_are_the_same_objects_in_the_same_order(tmp_path):
    items = [(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)) for _ in range(5)]
    seen = list(watch((item for item in items), tracking=False, folder=tmp_path))
    assert all(a is b for a, b in zip(seen, items, strict=True))
    assert _results(tmp_path)["epochs"][0]["samples_seen"] == 10


def test_an_iterable_dataset_in_workers(tmp_path):
    loader = DataLoader(Numbers(32), batch_size=4, num_workers=2)
    assert sum(len(labels) for _, labels in watch(loader, tracking=False, folder=tmp_path)) == 32
    assert _results(tmp_path)["epochs"][0]["samples_seen"] == 32


def _ended(tmp_path, how: str, store: str) -> dict:
    loader = _loader()
    if how == "close":
        watched = watch(loader, folder=tmp_path)
        iterator = iter(watched)
        next(iterator)
        watched.close()
        return _results(tmp_path)
    for index, _ in enumerate(watch(loader, folder=tmp_path)):
        if index == 2 and how == "break":
            break
        if index == 2 and how == "raise":
            raise ValueError("the user's own")
        if index == 2 and how == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt, as Python raises it
    return _results(tmp_path)


@pytest.mark.parametrize(
    "how, status, batches",
    [
        ("exhausted", "FINISHED", 10),
        ("break", "FINISHED", 3),
        ("close", "FINISHED", 1),
        ("raise", "FAILED", 3),
        ("ctrl-c", "KILLED", 3),
    ],
)
def test_every_way_a_loop_ends_is_recorded_with_its_status(
    tmp_path, store, pythons_sigint, how, status, batches
):
    if how == "raise":
        with pytest.raises(ValueError, match="the user's own") as raised:
            _ended(tmp_path, how, store)
        assert raised.type is ValueError  # the user's exception, unchanged
        results = _results(tmp_path)
    elif how == "ctrl-c":
        with pytest.raises(KeyboardInterrupt):
            _ended(tmp_path, how, store)
        results = _results(tmp_path)
    else:
        results = _ended(tmp_path, how, store)
    assert results["status"] == status
    assert results["epochs"][0]["batches"] == batches
    run = _run(store, results)
    assert run.info.status == status
    assert run.data.metrics["batches"] == batches
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_with_block_gives_the_exceptions_status(tmp_path, store):
    with pytest.raises(KeyError), watch(_loader(), folder=tmp_path) as batches:
        for index, _ in enumerate(batches):
            if index == 1:
                {}["missing"]
    assert _run(store, _results(tmp_path)).info.status == "FAILED"


def test_an_error_of_the_dataset_reaches_the_script_as_its_own(tmp_path):
    for n_workers, raised in ((0, KeyError), (1, KeyError)):
        with pytest.raises(raised, match="sample 5 is missing"):
            for _ in watch(_loader(n_workers, dataset=Squares(fail_at=5)), tracking=False):
                pass


def test_the_scripts_own_mlflow_run_is_kept_and_the_watch_run_nested_under_it(tmp_path, store):
    experiment = mlflow.MlflowClient(store).create_experiment("my-training")
    with mlflow.start_run(experiment_id=experiment, run_name="mine") as mine:
        for _ in watch(_loader(), folder=tmp_path):
            pass
        assert mlflow.active_run().info.run_id == mine.info.run_id
        mlflow.log_metric("my_loss", 1.0)  # still the script's to log into
    nested = _run(store, _results(tmp_path))
    assert nested.data.tags["mlflow.parentRunId"] == mine.info.run_id
    assert nested.info.experiment_id == experiment
    assert mlflow.get_run(mine.info.run_id).info.status == "FINISHED"


def test_a_store_that_does_not_answer_costs_one_line_and_keeps_everything(
    tmp_path, monkeypatch, caplog
):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with (
        _tracking_at(f"http://127.0.0.1:{port}", monkeypatch),
        caplog.at_level(logging.INFO, logger="facebench"),
    ):
        seen = sum(1 for _ in watch(_loader(), folder=tmp_path))
    assert seen == 10  # the script went on
    results = _results(tmp_path)
    assert results["tracking"] == "lost" and results["status"] == "FINISHED"
    said = [r.getMessage() for r in caplog.records if "did not take run" in r.getMessage()]
    assert len(said) == 1 and "python -m facebench.upload" in said[0]


def test_several_epochs_one_run(tmp_path, store):
    loader = _loader()
    assert sum(1 for _ in watch(loader, epochs=3, folder=tmp_path)) == 30
    results = _results(tmp_path)
    assert len(results["epochs"]) == 3 and results["metrics"]["measured_epochs"] == 3
    # A new watch of the same loader, the next epoch: the same run, one epoch more.
    for _ in watch(loader, folder=tmp_path):
        pass
    again = _results(tmp_path)
    assert again["job_id"] == results["job_id"] and len(again["epochs"]) == 4
    history = mlflow.MlflowClient(store).get_metric_history(again["run_id"], "batches")
    assert sorted(point.step for point in history) == [0, 1, 2, 3]


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_loader_is_as_it_was_after_watch(tmp_path, epochs):
    loader = _loader(1)
    collate, transform = loader.collate_fn, loader.dataset.transform
    for _ in watch(loader, epochs=epochs, tracking=False, folder=tmp_path):
        pass
    assert loader.collate_fn is collate and loader.dataset.transform is transform
    assert "__getitems__" not in vars(loader.dataset)
    first = next(iter(loader))
    assert isinstance(first, list) and len(first) == 2  # the user's batch, no Carried


def test_persistent_workers_keep_giving_the_users_batches_after_watch(tmp_path):
    loader = _loader(2, persistent_workers=True)
    for _ in watch(loader, tracking=False, folder=tmp_path):
        pass
    assert isinstance(loader.collate_fn, Carrier) is False
    unwatched = list(loader)  # the same workers, still carrying: handed on unwrapped
    assert len(unwatched) == 10 and all(isinstance(batch, list) for batch in unwatched)
    for _ in watch(loader, tracking=False, folder=tmp_path):
        pass
    assert _results(tmp_path)["epochs"][-1]["stage_load_us"] > 0


def test_a_loader_with_no_batch_and_a_batch_with_no_tensor_each_one_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="facebench"):
        assert list(watch([], tracking=False, folder=tmp_path / "none")) == []
        words = [["a", "b"], ["c"]]
        assert list(watch(words, tracking=False, folder=tmp_path / "words")) == words
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("yielded no batch" in line for line in said)
    assert any("no tensor to count" in line for line in said)
    assert not (tmp_path / "none" / "results.json").exists()


def test_an_image_folder_with_v2_augmentations_names_its_transforms(tmp_path, caplog):
    root = write_folder(tmp_path / "shop")
    loader = DataLoader(image_folder(str(root)), batch_size=8, num_workers=1)
    with caplog.at_level(logging.INFO, logger="facebench"):
        for _ in watch(loader, tracking=False, folder=tmp_path / "out"):
            pass
    metrics = _results(tmp_path / "out")["epochs"][0]
    assert metrics["part_RandomResizedCrop_us"] > 0 and metrics["stage_load_us"] > 0
    text = caplog.text
    assert "the loop waited for data" in text and "RandomResizedCrop" in text
    assert "loader.dataset._target_=torchvision.datasets.folder.ImageFolder" in text


class _Event:
    """A CUDA event's stand-in: its time is set by the test's clock."""

    clock = [0.0]

    def record(self) -> None:
        self.at = _Event.clock[0]

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, later: _Event) -> float:
        return (later.at - self.at) * 1000.0


def test_the_gpu_wait_is_the_time_from_each_request_to_the_next_handover():
    """10 ms of wait before each of 300 batches and after the last, 5 ms of step after each:
    the sums hold over the folds (every 512 events)."""
    gpu = GpuWait(True, new_event=_Event)
    clock = _Event.clock
    clock[0] = 0.0
    gpu.start()
    for _ in range(300):
        clock[0] += 0.010
        gpu.handover()
        clock[0] += 0.005
        gpu.request()
    clock[0] += 0.010  # the loader's end
    gpu.stop()
    clock[0] += 0.500  # the clock's own work after the end: none of the GPU's
    metrics = gpu.metrics()
    assert metrics["gpu_data_wait_s"] == pytest.approx(300 * 0.010 + 0.010)
    assert metrics["gpu_busy_s"] == pytest.approx(300 * 0.005)
    assert metrics["gpu_data_wait_frac"] == pytest.approx(3.01 / 4.51)


@pytest.mark.slow
def test_two_ranks_under_torchrun_are_recorded_once_pooled(tmp_path, isolated_env):
    import subprocess
    import sys

    from facebench.host.paths import PROJECT_ROOT

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(PROJECT_ROOT / "tests" / "watched_ddp.py"),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    metrics = _results(tmp_path / "out")["epochs"][0]
    assert metrics["world_size"] == 2 and metrics["samples_seen"] == 64  # both ranks' 32
    assert metrics["data_wait_frac_max"] >= metrics["data_wait_frac"]
    # Rank 0 alone says the epoch.
    assert result.stderr.count("epoch 0:") + result.stdout.count("epoch 0:") == 1


@pytest.mark.gpu
def test_on_a_gpu_the_event_wait_is_the_loaders_known_sleep(tmp_path):
    """Each batch comes 40 ms after it is asked for; the step queues under a millisecond of GPU
    work: the GPU waited about 40 ms a batch, and was busy for almost none of it."""
    import time

    def slow(n: int = 12):
        for _ in range(n):
            time.sleep(0.040)
            yield torch.zeros(8, 3, 8, 8), torch.zeros(8, dtype=torch.long)

    device = torch.device("cuda")
    work = torch.zeros(1024, device=device)
    for images, _ in watch(slow(), tracking=False, folder=tmp_path, device=device):
        work.add_(images.to(device, non_blocking=True).mean())
    metrics = _results(tmp_path)["epochs"][0]
    assert 12 * 0.040 <= metrics["gpu_data_wait_s"] <= 12 * 0.040 + 0.15
    assert metrics["gpu_busy_s"] < 0.05
    assert metrics["gpu_data_wait_frac"] > 0.8


@pytest.mark.slow
def test_the_documented_example_runs_as_written(tmp_path, isolated_env):
    """docs/watch.md's my_training.py, on a small folder set: it trains, and says what the
    docs say it says."""
    import re
    import subprocess
    import sys

    from facebench.host.paths import PROJECT_ROOT

    text = (PROJECT_ROOT / "docs" / "watch.md").read_text(encoding="utf-8")
    script = re.search(r"`my_training.py`:\n\n```python\n(.*?)```", text, re.DOTALL).group(1)
    (tmp_path / "my_training.py").write_text(script, encoding="utf-8")
    root = write_folder(tmp_path / "images", classes=2, per_class=96)
    result = subprocess.run(
        [sys.executable, "my_training.py", str(root)],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stderr
    for words in ("[facebench] epoch 0:", "the loop waited for data", "ColorJitter", "MLflow run"):
        assert words in said, said
    assert "INFO" not in said  # MLflow's own lines stay quiet
    assert list((tmp_path / "outputs" / "watch").glob("*/results.json"))


@pytest.mark.parametrize("how", ["exhausted", "break"])
def test_the_loaders_workers_are_gone_when_the_loop_ends_without_the_garbage_collector(
    tmp_path, how
):
    """Nothing of watch's keeps the loader's iterator (and its worker processes) alive once the
    loop has ended: the next epoch's workers would be forked with them."""
    import gc
    import multiprocessing

    loader = _loader(2)
    gc.disable()
    try:
        for index, _ in enumerate(watch(loader, tracking=False, folder=tmp_path)):
            if how == "break" and index == 1:
                break
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


def test_a_break_through_a_wrapping_generator_is_a_break(tmp_path):
    def wrapped(batches):  # as tqdm wraps an iterable
        yield from batches

    for index, _ in enumerate(wrapped(watch(_loader(), tracking=False, folder=tmp_path))):
        if index == 2:
            break
    assert _results(tmp_path)["status"] == "FINISHED"
    with pytest.raises(ZeroDivisionError):
        for _ in wrapped(watch(_loader(), tracking=False, folder=tmp_path)):
            raise ZeroDivisionError
    assert _results(tmp_path)["status"] == "FAILED"


def test_watches_that_end_in_any_order_put_the_scripts_sigint_handler_back(
    tmp_path, pythons_sigint
):
    first, second = _loader(), _loader()
    for _ in zip(
        watch(first, tracking=False, folder=tmp_path / "a"),
        watch(second, tracking=False, folder=tmp_path / "b"),
        strict=False,
    ):
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _WithSetter(Squares):
    """A transform kept behind a property with a setter."""

    @property
    def transform(self):
        return self._transform

    @transform.setter
    def transform(self, value):
        self._transform = value


def test_a_transform_behind_a_property_is_put_back(tmp_path):
    loader = _loader(dataset=_WithSetter())
    transform = loader.dataset.transform
    for _ in watch(loader, tracking=False, folder=tmp_path):
        pass
    assert loader.dataset.transform is transform


def test_a_watch_that_cannot_start_passes_the_batches_on_in_one_line(tmp_path, caplog):
    if torch.cuda.is_available():
        pytest.skip("needs a machine where CUDA cannot start")
    with caplog.at_level(logging.INFO, logger="facebench"):
        seen = list(watch(_loader(), tracking=False, folder=tmp_path, device="cuda"))
    assert len(seen) == 10
    failed = [r for r in caplog.records if "could not be completed" in r.getMessage()]
    assert len(failed) == 1 and "\n" not in failed[0].getMessage()


class _SlowToLetGo:
    """An iterable whose iterator takes a second to shut down, as a DataLoader's workers may."""

    def __iter__(self):
        return _SlowIterator()


class _SlowIterator:
    def __iter__(self):
        return self

    def __init__(self) -> None:
        self.left = 5

    def __next__(self):
        if not self.left:
            raise StopIteration
        self.left -= 1
        return torch.zeros(2, 3)

    def __del__(self):
        import time

        time.sleep(1.0)


def test_the_clock_stops_where_the_loop_ended_not_after_the_loader_shut_down(tmp_path):
    for index, _ in enumerate(watch(_SlowToLetGo(), tracking=False, folder=tmp_path)):
        if index == 1:
            break
    assert _results(tmp_path)["epochs"][0]["epoch_time_s"] < 0.5
