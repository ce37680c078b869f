"""loader=custom: a user's own pipeline measured as it is, its time inside the workers found,
and what goes wrong with it said in one line."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facebench import stages
from facebench.advise.own import REMEDIES
from facebench.custom import target
from facebench.custom.probes import Timed, TimedSamples, timed_transform
from facebench.errors import ConfigError, DataError
from facebench.host.paths import PROJECT_ROOT
from facebench.run.guesses import own_pipeline_guess
from facebench.run.runner import run_training
from tests.own_pipelines import image_folder, write_folder

OWN = "tests.own_pipelines"


def _run(make_cfg, tmp_path: Path, *overrides: str) -> dict[str, float]:
    host_only = [] if any(o.startswith("model=") for o in overrides) else ["host_only=true"]
    cfg = make_cfg("loader=custom", *host_only, *overrides)
    return run_training(cfg, output_dir=tmp_path)


def _train_py(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """train.py, loader only, launched from `folder` with the suite's pipelines importable."""
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    command = [
        sys.executable,
        str(PROJECT_ROOT / "train.py"),
        *args,
        "model=none",
        "host_only=true",
    ]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_an_image_folder_with_v2_augmentations_is_timed_transform_by_transform(make_cfg, tmp_path):
    root = write_folder(tmp_path / "images")
    metrics = _run(
        make_cfg,
        tmp_path,
        f"loader.dataset._target_={OWN}.image_folder",
        f"+loader.dataset.root={root}",
        "n_workers=2",
    )
    assert metrics["samples_seen"] == 48  # 2 classes x 24, in whole batches of 8
    assert metrics["custom_dataset_len"] == 48
    for name in ("PILToTensor", "RandomResizedCrop", "ColorJitter", "ToDtype", "Normalize"):
        assert metrics[f"part_{name}_us"] > 0, name
    # The Compose's steps lie inside its time (its own loop, and on a busy machine the waits
    # between steps, aside); reading and decoding are `load`.
    parts = sum(v for k, v in metrics.items() if k.startswith("part_") and k.endswith("_us"))
    assert 0 < parts <= metrics["stage_transform_us"]
    assert metrics["stage_load_cpu_us"] > 0 and metrics["stage_collate_cpu_us"] > 0
    assert metrics["stage_read_us"] == metrics["stage_decode_us"] == 0


def test_the_users_compose_is_left_as_it_was(tmp_path):
    stack = image_folder(str(write_folder(tmp_path / "images"))).transform
    before = list(stack.transforms)
    timed = timed_transform(stack)
    assert stack.transforms == before and timed.transform.transforms != before
    assert timed_transform(timed) is timed  # never timed twice


def test_an_iterable_dataset_split_by_worker_is_seen_once(make_cfg, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        metrics = _run(make_cfg, tmp_path, f"loader.dataset._target_={OWN}.Numbers", "n_workers=2")
    assert metrics["samples_seen"] == 64 and metrics["custom_same_start_workers"] == 0
    assert "29804" not in caplog.text


def test_an_iterable_dataset_every_worker_yields_whole_is_warned(make_cfg, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        metrics = _run(
            make_cfg,
            tmp_path,
            f"loader.dataset._target_={OWN}.Numbers",
            "+loader.dataset.sharded=false",
            "n_workers=2",
        )
    assert metrics["samples_seen"] == 128  # each of the 2 workers yielded all 64
    assert metrics["custom_same_start_workers"] == 2
    assert "not split between workers" in caplog.text and "29804" in caplog.text


def test_a_whole_dataloader_with_its_own_collate_is_used_as_it_is(make_cfg, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        metrics = _run(
            make_cfg,
            tmp_path,
            f"loader.dataset._target_={OWN}.whole_loader",
            "loader.batch_size_from=pixels",
            "epochs=2",
        )
    assert metrics["samples_seen"] == 48 and metrics["batches"] == 8  # its batch size: 6
    assert metrics["stage_load_cpu_us"] > 0 and metrics["stage_collate_cpu_us"] > 0
    assert "batch_size=8 (it has 6)" in caplog.text and "n_workers=0 (it has 1)" in caplog.text


def test_a_hugging_face_dataset_with_set_transform(make_cfg, tmp_path):
    pytest.importorskip("datasets")
    metrics = _run(make_cfg, tmp_path, f"loader.dataset._target_={OWN}.hugging_face")
    assert metrics["samples_seen"] == 40
    assert metrics["part_to_tensors_us"] > 0  # set_transform's function, by its name


def test_a_workers_growing_memory_is_warned(make_cfg, tmp_path, caplog, monkeypatch):
    from facebench.custom import carrier

    monkeypatch.setattr(carrier, "MEMORY_EVERY_S", 0.0)  # every batch: the epoch is short
    monkeypatch.setattr(carrier, "MEMORY_SHARE", 0.0)
    with caplog.at_level(logging.WARNING):
        metrics = _run(make_cfg, tmp_path, f"loader.dataset._target_={OWN}.Hoarder", "n_workers=1")
    assert metrics["worker_private_growth_mb"] >= 64
    assert "13246" in caplog.text


def test_a_sample_that_raises_names_its_index(make_cfg, tmp_path):
    with pytest.raises(DataError, match=r"dataset\[13\] raised ValueError: no such square"):
        _run(
            make_cfg,
            tmp_path,
            f"loader.dataset._target_={OWN}.Squares",
            "+loader.dataset.n=17",
            "loader.shuffle=false",
        )


def test_a_batch_with_no_tensor_says_what_to_count(make_cfg, tmp_path):
    with pytest.raises(DataError, match="no tensor to count its samples by"):
        _run(make_cfg, tmp_path, f"loader.dataset._target_={OWN}.no_tensors")


def test_a_model_needs_image_batches(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="no `classes` list"):
        _run(make_cfg, tmp_path, f"loader.dataset._target_={OWN}.Squares", "model=resnet18")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, r"_target_ is not set"),
        ({"_target_": "nosuchmodule.Thing"}, r"no module nosuchmodule .*PYTHONPATH"),
        ({"_target_": f"{OWN}.Nothing"}, r"has no Nothing; it has"),
        ({"_target_": f"{OWN}.math"}, r"is a module, not a class or function"),
        ({"_target_": f"{OWN}.broken"}, r"raised FileNotFoundError while being built: /nowhere"),
        ({"_target_": f"{OWN}.not_a_dataset"}, r"returned a int, which is not a Dataset"),
    ],
)
def test_a_target_that_cannot_give_a_pipeline_is_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as raised:
        target.build(spec)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "arg",
    [
        "loader=tests.own_pipelines.whole_loader",
        "+loader._target_=tests.own_pipelines.whole_loader",
        "data._target_=tests.own_pipelines.whole_loader",
    ],
)
def test_first_guesses_are_shown_the_custom_form(arg):
    line = own_pipeline_guess([arg], ["custom", "dataset"])
    assert "loader=custom loader.dataset._target_=tests.own_pipelines.whole_loader" in line


def test_a_module_named_as_a_loader_is_shown_the_custom_form(tmp_path, monkeypatch):
    (tmp_path / "mydata.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    line = own_pipeline_guess(["loader=mydata"], ["custom", "dataset"])
    assert "mydata is a Python module here" in line
    assert own_pipeline_guess(["loader=dataset"], ["custom", "dataset"]) is None


def test_train_py_answers_a_first_guess_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "train.py", "+loader._target_=mydata.build_loader"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "loader=custom loader.dataset._target_=mydata.build_loader" in done.stderr


@pytest.mark.slow
def test_a_users_loader_from_their_config_folder_sweeps_beside_built_in_ones(
    tmp_path, isolated_env, cache
):
    conf = tmp_path / "myconf" / "loader"
    conf.mkdir(parents=True)
    (conf / "shop.yaml").write_text(
        f"defaults:\n  - custom\n\ndataset:\n  _target_: {OWN}.Squares\n  n: 32\n"
    )
    done = _train_py(
        tmp_path,
        isolated_env,
        "-m",
        f"hydra.searchpath=[file://{tmp_path / 'myconf'}]",
        "loader=shop,raw",
        "n_workers=1",
        "batch_size=8",
        "data.n_images=64",
        f"data.cache_dir={cache}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "the sweep's 2 runs" in out, out[-3000:]
    table = out[out.index("the sweep's 2 runs") :]
    assert "own tests.own_pipelines.Squares 32  shop" in table
    assert table.count("FINISHED") == 2


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def Busy(sample: int) -> int:  # noqa: N802 - named as a transform class would be
    _spin(0.02)
    return sample


_busy = Busy


class _Slow:
    """A sample that computes 10 ms itself and 20 ms in its transform."""

    def __init__(self) -> None:
        self.transform = Timed(_busy)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        _spin(0.01)
        return self.transform(index)


def test_load_leaves_out_the_time_its_transforms_took():
    stages.begin_epoch(True)
    TimedSamples(_Slow())[0]
    times = stages.take()
    load, transform = times.stage_cpu_ns[stages.LOAD], times.stage_cpu_ns[stages.TRANSFORM]
    assert 0.01e9 <= load < 0.015e9 and 0.02e9 <= transform < 0.025e9
    ((name, wall),) = times.parts
    assert name == "Busy" and wall == times.ns[stages.TRANSFORM]


def test_the_documented_example_is_bench_shopdata_and_runs(make_cfg, tmp_path, monkeypatch):
    doc = (PROJECT_ROOT / "docs" / "own-pipeline.md").read_text(encoding="utf-8")
    code = (PROJECT_ROOT / "bench" / "shopdata.py").read_text(encoding="utf-8")
    assert f"```python\n{code}```" in doc
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "bench"))
    root = write_folder(tmp_path / "images")
    metrics = _run(
        make_cfg,
        tmp_path,
        "loader.dataset._target_=shopdata.shop_images",
        f"+loader.dataset.root={root}",
    )
    assert metrics["part_ColorJitter_us"] > 0 and metrics["samples_seen"] == 48


@pytest.mark.slow
def test_advise_measures_a_users_pipeline_and_the_remedies_on_its_images(make_cfg, tmp_path):
    from facebench.advise.run import advise

    root = write_folder(tmp_path / "images", per_class=40)
    cfg = make_cfg(
        "loader=custom",
        f"loader.dataset._target_={OWN}.image_folder",
        f"+loader.dataset.root={root}",
        "accelerator=h100",
        "budget_s=60",
        "workers=[1]",
        config_name="advise",
    )
    advice = advise(cfg)
    names = [measured.name for measured in advice.measured]
    assert names[0] == "custom" and "raw" in names and set(names) <= {"custom", *REMEDIES}
    assert advice.measured[0].rates, advice.measured[0].note
    assert any("ColorJitter" in line for line in advice.inside), advice.inside
    assert "Inside custom" in advice.markdown()
    # facebench's shards of the user's folder are kept away from it: not a class to ImageFolder.
    assert not (root / "facebench-shards").exists()


def test_a_collate_that_raises_is_one_line(make_cfg, tmp_path):
    with pytest.raises(DataError, match="collate_fn raised KeyError: 'pixels'"):
        _run(
            make_cfg,
            tmp_path,
            f"loader.dataset._target_={OWN}.Squares",
            f"loader.collate_fn._target_={OWN}.bad_collate",
        )


@pytest.mark.slow
def test_a_sample_failing_in_a_worker_of_the_users_dataloader_is_one_line(tmp_path, isolated_env):
    done = _train_py(
        tmp_path,
        isolated_env,
        "loader=custom",
        f"loader.dataset._target_={OWN}.whole_loader",
        "+loader.dataset.n=17",
        "loader.batch_size_from=pixels",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "dataset[13] raised ValueError: no such square" in out
    assert "Traceback" not in out
    assert '"status": "FAILED"' in (tmp_path / "run" / "results.json").read_text()


@pytest.mark.parametrize("collate", ["Stacker", "scaled_collate"])
def test_a_collate_with_settings_is_a_class_instance_or_a_partial(make_cfg, tmp_path, collate):
    metrics = _run(
        make_cfg,
        tmp_path,
        f"loader.dataset._target_={OWN}.Squares",
        f"loader.collate_fn._target_={OWN}.{collate}",
        "+loader.collate_fn.scale=2.0",
    )
    assert metrics["samples_seen"] == 64 and metrics["stage_collate_cpu_us"] > 0


def test_an_installed_package_named_as_a_loader_keeps_its_typo_hint():
    from facebench.run.entry import unknown_choice

    assert own_pipeline_guess(["loader=datasets"], ["custom", "dataset"]) is None
    assert "did you mean loader=dataset?" in unknown_choice(["loader=datasets"])


def test_a_mapping_batch_is_counted_by_its_tensors():
    from collections import UserDict

    import torch

    from facebench.loaders.custom_batches import to_batch

    batch = to_batch(UserDict(pixels=torch.zeros(5, 3, 2, 2), label=torch.arange(5)))
    assert len(batch.labels) == 5 and batch.labels.tolist() == [0, 1, 2, 3, 4]
