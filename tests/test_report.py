"""What the report and advise's chart show: only settings that apply, and scales that compare."""

from __future__ import annotations

import json
import logging

import matplotlib
import pytest
from omegaconf import OmegaConf

from facebench.advise.answer import Advice
from facebench.advise.chart import chart as advice_chart
from facebench.advise.measure import Measured
from facebench.report.chart import chart as report_chart
from facebench.report.markdown import render
from facebench.report.sweep_table import Cell, title

matplotlib.use("Agg")

SETTINGS = (
    ("data", "folder"),
    ("data.root", "/data/mine"),
    ("data.n_images", "0"),
    ("model", "none"),
    ("amp_resolved", "bf16"),
    ("batch_size", "600"),
    ("max_batches", "0"),
    ("shard_size", "10000"),
)


def test_headings_show_only_the_settings_that_apply():
    # No model: no precision; folder data: no synthetic size; the asked shard_size never (the
    # size used is a note of its own).
    assert title(SETTINGS) == "data=folder, data.root=/data/mine, model=none, batch_size=600"
    synthetic = title((("data", "synthetic"), ("data.n_images", "6000"), *SETTINGS[3:]))
    assert synthetic == "data=synthetic, data.n_images=6000, model=none, batch_size=600"
    trained = title((("model", "resnet50"), ("amp_resolved", "bf16")))
    assert trained == "model=resnet50, amp_resolved=bf16"


def test_the_report_says_the_shard_size_each_run_used():
    table = {
        5: {"pickle": Cell(1.4, 4300.0, 1, shard_size_used=600), "dataset": Cell(3.0, 2000.0, 1)},
        10: {"pickle": Cell(1.7, 3600.0, 1, shard_size_used=600)},
    }
    text = render((("model", "none"),), table)
    note = (
        "Samples per shard (`shard_size_used`): pickle with 5 workers: 600; "
        "pickle with 10 workers: 600."
    )
    assert note in text


def test_report_panels_share_one_linear_scale(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", lambda figure: drawn.append(figure))
    table = {2: {"dataset": Cell(10.0, 2_000.0, 1), "raw": Cell(0.5, 40_000.0, 1)}}
    report_chart({(("model", "none"),): table}, tmp_path / "report.png", with_article=True)
    [figure] = drawn
    rates = [axis for axis in figure.axes if axis.get_xlabel().startswith("images/s")]
    assert len(rates) == 2  # the sweep's and the article's
    assert {axis.get_xscale() for axis in rates} == {"linear"}
    assert rates[0].get_xlim() == rates[1].get_xlim()
    assert rates[0].get_xlim()[1] > 40_000


def test_advice_chart_is_linear_and_names_the_models_pace(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", lambda figure: drawn.append(figure))
    measured = [Measured("raw", rates={1: 22_254.0}), Measured("datapipe", rates={2: 380.0})]
    advice_chart(Advice("resnet50", "cpu", 22.0, 6000, 6000, measured, 60, 300), tmp_path / "a.png")
    [axis] = drawn[0].axes
    assert axis.get_xscale() == "linear"
    assert "resnet50's pace, 22" in axis.get_xlabel()
    labels = [text.get_text() for text in axis.texts]
    assert "22,254 (1 worker), 1,011.5x the model's pace" in labels
    assert "380 (2 workers), 17.3x the model's pace" in labels


def test_a_sweep_ends_with_its_runs_in_job_order_and_counts_jobs_without_results(tmp_path, caplog):
    from facebench.report.sweep_summary import SweepSummary

    def job(number: int, name: str, rate: float | None, status: str) -> None:
        folder = tmp_path / str(number)
        folder.mkdir()
        metrics = {"images_per_s": rate, "data_wait_frac": 0.5} if rate else {}
        results = {
            "run_name": name,
            "params": {"loader": name.split("-")[0], "n_workers": 5, "data": "synthetic"},
            "tags": {"data_set": "synthetic 6,000"},
            "metrics": metrics,
            "status": status,
            "compare_url": "http://127.0.0.1:5000/#/x",
        }
        (folder / "results.json").write_text(json.dumps(results))

    job(10, "pickle-w5", 4300.25, "FINISHED")
    job(2, "dataset-w5", 2041.3, "FINISHED")
    job(3, "datapipe-w5", None, "FAILED")
    (tmp_path / "4").mkdir()  # failed before its run began: no results.json
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with caplog.at_level(logging.INFO, logger="facebench"), pytest.raises(SystemExit) as ended:
        SweepSummary().on_multirun_end(config)
    assert ended.value.code == 1  # two jobs failed
    table = caplog.records[0].getMessage().splitlines()
    assert table[0] == "the sweep's 3 runs:"
    assert table[1].split() == [
        "run",
        "data",
        "loader",
        "workers",
        "images/s",
        "data",
        "wait",
        "status",
    ]
    rows = [line.split() for line in table[2:]]
    assert [row[0] for row in rows] == ["dataset-w5", "datapipe-w5", "pickle-w5"]  # job order
    assert rows[0][1:] == ["synthetic", "6,000", "dataset", "5", "2,041.3", "50%", "FINISHED"]
    assert rows[1][-3:] == ["-", "-", "FAILED"]
    messages = [record.getMessage() for record in caplog.records[1:]]
    assert messages[0].startswith("1 of the sweep's 4 jobs recorded no results")
    assert messages[1] == "side by side in MLflow: http://127.0.0.1:5000/#/x"


def test_a_sweep_with_runs_not_in_mlflow_says_how_to_put_them_there(tmp_path, caplog):
    from facebench.report.sweep_summary import SweepSummary

    for number, tracking in enumerate(["mlflow", "lost", "off"]):
        (tmp_path / str(number)).mkdir()
        results = {
            "run_name": f"raw-w{number}",
            "params": {"loader": "raw", "n_workers": number},
            "metrics": {"images_per_s": 100.0, "data_wait_frac": 0.5},
            "status": "FINISHED",
            "tracking": tracking,
        }
        (tmp_path / str(number) / "results.json").write_text(json.dumps(results))
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with caplog.at_level(logging.INFO, logger="facebench"), pytest.raises(SystemExit) as ended:
        SweepSummary().on_multirun_end(config)
    assert ended.value.code == 3  # every job finished; one run is not in MLflow
    rows = caplog.records[0].getMessage().splitlines()[2:]
    assert [row.endswith("FINISHED, not in MLflow") for row in rows] == [False, True, False]
    said = [record.getMessage() for record in caplog.records]
    assert (
        "1 of the sweep's runs finished but are not in MLflow (it failed during them); once it "
        f"answers: python -m facebench.upload {tmp_path}"
    ) in said


def test_a_sweep_of_emulated_accelerators_shows_the_rate_au_follows(tmp_path, caplog):
    # 8 h100s at AU 25%: 9,291.6 images/s over the whole epoch (start-up included) is not the
    # rate AU is a share of; 0.25 x 8 x 8,960 = 17,920 images/s in the time AU counts is.
    from facebench.report.sweep_summary import SweepSummary

    for number, (count, au, rate) in enumerate([(1, 0.954, 7_000.1), (8, 0.25, 9_291.6)]):
        (tmp_path / str(number)).mkdir()
        results = {
            "run_name": f"raw-w1-bs50-h100{f'-x{count}' if count > 1 else ''}",
            "params": {
                "loader": "raw",
                "n_workers": 1,
                "accelerator.name": "h100",
                "accelerators_per_host": count,
                "accelerator_images_per_s": 8960.0,
            },
            "metrics": {"images_per_s": rate, "data_wait_frac": 0.6, "au": au, "au_pass": 0.0},
            "status": "FINISHED",
        }
        (tmp_path / str(number) / "results.json").write_text(json.dumps(results))
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with caplog.at_level(logging.INFO, logger="facebench"):
        SweepSummary().on_multirun_end(config)
    lines = caplog.records[0].getMessage().splitlines()
    assert lines[1].split()[4:] == ["images/s", "data", "wait", "AU", "AU", "images/s", "status"]
    assert lines[3].split()[-5:] == ["9,291.6", "60%", "25%", "17,920", "FINISHED"]
    legend = " ".join(lines[4:])
    assert "images/s: the whole epoch, start-up included" in legend
    assert "AU: the accelerators' computing time over the time after their first step" in legend


def test_the_report_says_which_span_au_and_the_rate_cover():
    table = {1: {"raw": Cell(0.6, 9_291.6, 1, au=0.25)}}
    text = render((("model", "none"),), table)
    assert "AU is the accelerators' computing time over the time after their first step" in text
    assert "img/s is the whole epoch, start-up included" in text
    assert "AU is" not in render((("model", "none"),), {1: {"raw": Cell(0.6, 9_291.6, 1)}})
