"""train.py as a user runs it: one job, a multirun, and bad values."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf.errors import ValidationError

from facebench.errors import ConfigError
from facebench.host.paths import PROJECT_ROOT
from facebench.tracking.mlflow_views import read_view


def train(tmp_path: Path, cache: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        str(PROJECT_ROOT / "train.py"),
        *[arg for arg in args if arg.startswith("-")],  # Hydra's flags come before overrides
        "device=cpu",
        f"data.cache_dir={cache}",
        "data.n_images=120",
        "batch_size=16",
        f"hydra.run.dir={tmp_path / 'outputs'}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
        *[arg for arg in args if not arg.startswith("-")],  # last: they win over the above
    ]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def runs(tmp_path: Path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["facebench"], output_format="list")


@pytest.mark.slow
def test_one_run_is_recorded_with_metrics_params_and_tags(tmp_path, cache, isolated_env):
    result = train(
        tmp_path, cache, isolated_env, "model=resnet18", "amp=off", "max_batches=2", "n_workers=1"
    )
    assert result.returncode == 0, result.stderr
    [run] = runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "dataset-w1-bs16-fp32-resnet18"
    metrics = run.data.metrics
    assert metrics["samples_seen"] == 32
    # Logged to 6 significant digits.
    assert metrics["images_per_s"] == pytest.approx(32 / metrics["epoch_time_s"], rel=1e-5)
    assert metrics["loss_first"] > 0
    params = run.data.params
    assert params["loader"] == "dataset" and params["n_workers"] == "1"
    assert params["batch_size"] == "16" and params["amp"] == "off"
    assert params["amp_resolved"] == "fp32" and params["amp_reason"] == "amp=off"
    assert params["data.n_images"] == "120" and params["device_type"] == "cpu"
    assert "" not in params.values() and "data.root" not in params  # no empty params
    tags = run.data.tags
    assert tags["torch_version"] and tags["git_commit"] and tags["device_name"]
    assert tags["cpu"] == tags["device_name"] and int(tags["cpu_cores"]) >= 1
    assert tags["gpu"] == "none" and tags["gpu_count"] == "0"
    # The experiment opens on the runs table, and a shared view shows the headline numbers.
    experiment = mlflow.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    view = read_view(experiment.tags["mlflow.sharedViewState.facebench"])
    assert "metrics.`images_per_s`" in view["selectedColumns"]
    assert "params.`n_workers`" in view["selectedColumns"]
    url = f"/#/experiments/{run.info.experiment_id}/runs?viewStateShareKey=facebench&"
    assert url + "workflowType=machine_learning" in result.stdout + result.stderr
    # Artifacts land beside the store, not in the working directory's mlruns/.
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(tmp_path / "mlruns")
    assert (artifacts / "results.json").is_file() and (artifacts / "config.yaml").is_file()
    assert (tmp_path / "outputs" / "results.json").is_file()


@pytest.mark.slow
def test_multirun_records_one_run_per_job(tmp_path, cache, isolated_env):
    result = train(tmp_path, cache, isolated_env, "-m", "n_workers=0,1", "model=none")
    assert result.returncode == 0, result.stderr
    recorded = runs(tmp_path)
    assert sorted(r.info.run_name for r in recorded) == [
        "dataset-w0-bs16-loader-only",
        "dataset-w1-bs16-loader-only",
    ]
    assert all(r.data.metrics["samples_seen"] == 112 for r in recorded)  # 7 batches of 16
    assert len({r.data.tags["sweep_id"] for r in recorded}) == 1
    assert {r.data.tags["data_set"] for r in recorded} == {"synthetic 120"}
    # The sweep ends with one table of its runs and one URL, not a URL after every job.
    output = result.stdout + result.stderr
    assert output.count("viewStateShareKey=sweep-") == 1
    table = output.split("the sweep's 2 runs:")[1]
    for workers in (0, 1):
        name = f"dataset-w{workers}-bs16-loader-only"
        row = rf"{name} +synthetic 120 +dataset +{workers} +[\d,.]+ +\d+% +FINISHED"
        assert re.search(row, table), table
    assert table.index("side by side in MLflow") > table.index("dataset-w1-bs16-loader-only")


@pytest.mark.slow
def test_a_failed_job_is_marked_failed_and_the_sweep_goes_on(tmp_path, cache, isolated_env):
    # The second job points at a folder that does not exist: refused before its MLflow run.
    result = train(
        tmp_path,
        cache,
        isolated_env,
        "-m",
        "model=none",
        "data=synthetic,celeba_digiface",
        f"data.root={tmp_path / 'missing'}",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "missing: no such folder" in output and "Traceback" not in output
    statuses = {r.data.params["data"]: r.info.status for r in runs(tmp_path)}
    assert statuses == {"synthetic": "FINISHED"}  # no FAILED run left behind
    # The sweep's summary still comes, with the failed job in it.
    assert "the sweep's 2 runs:" in output
    assert re.search(
        r"dataset-w5-bs16-loader-only +celeba_digiface +dataset +5 +- +- +FAILED", output
    ), output


@pytest.mark.slow
def test_bad_value_fails_with_one_clear_line(tmp_path, cache, isolated_env):
    result = train(tmp_path, cache, isolated_env, "batch_size=0")
    output = result.stdout + result.stderr  # Hydra logs to stdout
    assert result.returncode == 1
    assert "batch_size=0: must be at least 1" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["loader=datapipes"], "loader=datapipes: no such choice (conf/loader/ holds ceiling, "),
        (["loader=datapipes"], "; did you mean loader=datapipe?"),
        (["data=celeb"], "data=celeb: no such choice (conf/data/ holds celeba_digiface, folder, "),
        (["data=celeb"], "did you mean data=celeba_digiface?"),
        (["-m", "n_workers=1", "loader=dataset,pickl"], "did you mean loader=pickle?"),
        (["experiment=artcle"], "did you mean experiment=article?"),
        (["loader=zzzzzz"], "loader=zzzzzz: no such choice (conf/loader/ holds ceiling, "),
        (["loader=zzzzzz"], "your own pipeline: loader=custom loader.dataset._target_="),
        # A search path's loaders are read from its loader/ folder: none there holds nope.
        (["loader=nope", "hydra.searchpath=[file:///elsewhere]"], "loader=nope: no such choice"),
    ],
)
def test_an_unknown_choice_names_the_real_ones_and_the_closest(args, says):
    from facebench.run.entry import unknown_choice

    said = unknown_choice(args)
    assert said is not None and says in said
    assert "schema" not in said  # the options' schemas are no choices
    assert "did you mean" not in unknown_choice(["loader=zzzzzz"])


@pytest.mark.parametrize(
    "args",
    [
        ["loader=raw", "data=folder"],
        ["-m", "loader=dataset,datapipe,pickle", "n_workers=5,10"],
        ["experiment=null", "loader=glob(*)", "data.root=/x=y"],
        ["data=nope", "hydra.searchpath=[file:///elsewhere]"],  # its choices are not ours
    ],
)
def test_real_choices_pass(args):
    from facebench.run.entry import unknown_choice

    assert unknown_choice(args) is None


@pytest.mark.slow
def test_an_unknown_choice_is_one_line_from_the_command_line(tmp_path, cache, isolated_env):
    result = train(tmp_path, cache, isolated_env, "loader=datapipes")
    assert result.returncode == 1
    choices = ", ".join(sorted(path.stem for path in (PROJECT_ROOT / "conf/loader").glob("*.yaml")))
    assert result.stderr.strip().splitlines() == [
        f"loader=datapipes: no such choice (conf/loader/ holds {choices}); did you mean "
        "loader=datapipe?"
    ]


@pytest.mark.parametrize(
    ("override", "error", "says"),
    [
        ("n_workers=abc", ValidationError, "could not be converted to Integer"),
        ("loader=nope", ConfigCompositionException, "loader"),
        ("loader.nope=1", ConfigCompositionException, "nope"),
        ("amp=fp8", ValidationError, "expected one of [auto, fp16, bf16, off]"),
        ("model=vgg11", ValidationError, "expected one of [resnet50, resnet18, none]"),
        ("cache=hot", ValidationError, "expected one of [warm, cold, keep]"),
        ("on_bad_sample=ignore", ValidationError, "expected one of [raise, skip]"),
        ("loader.crop=left", ValidationError, "expected one of [random, center]"),
        ("loader=nodes loader.decoder=quick", ValidationError, "one of [torchvision, pil, fast]"),
        ("loader=nodes loader.method=fork", ValidationError, "expected one of [process, thread,"),
    ],
)
def test_bad_config_fails_at_compose_time(make_cfg, override, error, says):
    with pytest.raises(Exception) as raised:
        make_cfg(*override.split())
    # Hydra wraps the OmegaConf error; the message names the key either way.
    assert says in str(raised.value) or says in str(raised.value.__cause__)
    assert isinstance(raised.value, error) or isinstance(raised.value.__cause__, error)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("batch_size=0", "batch_size=0: must be at least 1"),
        ("n_workers=-1", "n_workers=-1: must be 0 or more"),
        ("device=gpu", "device=gpu: use auto, cpu, cuda or cuda:N"),
        ("data=celeba_digiface", "data.root is empty"),
        ("loader=datapipe loader.shuffle_buffer=0", "loader.shuffle_buffer=0: must be at least 1"),
        ("seed=-1", "seed=-1: use a seed from 0 to 2"),
        ("loader=nodes loader.method=none", "loader.method=none: this loader's workers run as"),
        (f"seed={2**32}", f"seed={2**32}: use a seed from 0 to 2"),
        ("data.seed=-3", "data.seed=-3: use a seed from 0 to 2"),
        ("data.root=/data/faces", "data.root=/data/faces: data=synthetic generates its own"),
        ("+unknown_key=1", "unknown_key: no such key"),
        ("loader=raw +loader.shuffle_buffer=5", "loader.shuffle_buffer: no such key"),
        ("+data.colour=red", "data.colour: no such key"),
        ("data.labels=x.csv", "data.labels=x.csv: a labels CSV is read with data=folder"),
        ("data=folder", "data.root is empty: data=folder reads a real dataset"),
        ("model=resnet18 host_only=true", "host_only=true measures the loader alone; it needs"),
        ("accelerators_per_host=4", "accelerators_per_host=4 emulates that many accelerators"),
        ("accelerator=h100 accelerator.min_au=90", "accelerator.min_au=90: a share from 0 to 1"),
        ("accelerator=custom accelerator.images_per_s=-5", "accelerator.images_per_s=-5: must"),
    ],
)
def test_bad_values_are_named(make_cfg, override, says):
    with pytest.raises(ConfigError, match=says):
        make_cfg(*override.split())


def test_the_article_experiment_is_its_sweep():
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", ["experiment=article"], return_hydra_config=True)
    assert cfg.hydra.mode == RunMode.MULTIRUN
    assert cfg.hydra.sweeper.params == {"loader": "dataset,datapipe,pickle", "n_workers": "5,10"}
    assert (cfg.batch_size, cfg.model, cfg.amp) == (600, "resnet50", "auto")


@pytest.mark.slow  # the command line itself; the config it composes is checked above
@pytest.mark.parametrize("spelling", ["experiment=article", "+experiment=article"])
def test_the_article_experiment_is_chosen_with_or_without_a_plus(spelling):
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "train.py"), spelling, "--cfg", "hydra"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mode: MULTIRUN" in result.stdout and "loader: dataset,datapipe,pickle" in result.stdout


@pytest.mark.slow
def test_the_article_comparison_on_a_real_layout_tree(tmp_path, cache, isolated_env, tree_factory):
    root = tree_factory(
        celeba={f"{i:06d}.jpg": 1 + i % 5 for i in range(1, 21)}, digiface={0: 20, 3: 20}
    )
    data = ["data=celeba_digiface", f"data.root={root}", "shard_size=16"]
    prepare = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "prepare.py"),
            *data,
            f"hydra.run.dir={tmp_path / 'prepare'}",
        ],
        cwd=tmp_path,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert prepare.returncode == 0, prepare.stdout + prepare.stderr
    assert (root / "facebench-shards" / "pickle" / "manifest.json").is_file()
    result = train(
        tmp_path,
        cache,
        isolated_env,
        "-m",
        "loader=dataset,datapipe,pickle",
        "n_workers=0,2",
        "model=none",
        "batch_size=4",
        *data,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = runs(tmp_path)
    assert sorted(r.info.run_name for r in recorded) == sorted(
        f"{loader}-w{workers}-bs4-loader-only"
        for loader in ("dataset", "datapipe", "pickle")
        for workers in (0, 2)
    )
    assert all(r.info.status == "FINISHED" for r in recorded)
    # 60 images in batches of 4: every loader delivers all of them.
    assert all(r.data.metrics["samples_seen"] == 60 for r in recorded)
    assert all(r.data.metrics["samples_unique"] == 60 for r in recorded)
    assert not any("prepare_s" in r.data.metrics for r in recorded)  # prepare.py built them

    # The report turns this sweep into the article's table, a chart, and a report run.
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "facebench.report",
            "--with-article",
            "--out",
            str(tmp_path / "r"),
        ],
        cwd=tmp_path,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "| n workers | dataset | datapipe | pickle |" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 2 |", "| 0 |"))]
    assert [row[:5] for row in rows] == ["| 0 |", "| 2 |"]  # workers in ascending order
    assert all(line.count("img/s") == 3 for line in rows)
    # The article's numbers as a table of their own, with no empty cell.
    assert "### The article" in text and "| 5 | 10,034 s, 92 img/s |" in text
    assert "| |" not in text and "|  |" not in text
    assert (tmp_path / "r" / "report.png").stat().st_size > 10_000
    assert (tmp_path / "r" / "report.md").read_text() == text
    # The report run sits apart from the training runs.
    assert all(r.data.tags.get("facebench.kind") != "report" for r in runs(tmp_path))
    reports = mlflow.search_runs(experiment_names=["facebench-reports"], output_format="list")
    assert [r.info.run_name for r in reports] == [f"report-{recorded[0].data.tags['sweep_id']}"]


@pytest.mark.parametrize(
    ("arg", "now", "noted"),
    [
        ("loader=synthetic", "loader=ceiling", True),
        ("loader=dataset,synthetic", "loader=dataset,ceiling", True),
        ("data=synthetic", "data=synthetic", False),  # the generated data keeps its name
        ("+experiment=article", "experiment=article", False),
        ("n_workers=5,10", "n_workers=5,10", False),
    ],
)
def test_old_spellings_still_run_with_a_note(arg, now, noted, capsys):
    from facebench.run.entry import spelled_now

    assert spelled_now(arg) == now
    note = capsys.readouterr().err
    assert ("running loader=ceiling" in note) == noted
    assert note.count("\n") == int(noted)  # one line
