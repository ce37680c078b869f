"""What the report and advise's chart show: only settings that apply, and scales that compare."""

from __future__ import annotations

import matplotlib

from facebench.advise.answer import Advice
from facebench.advise.chart import chart as advice_chart
from facebench.advise.measure import Measured
from facebench.report import Cell, render, title
from facebench.report_chart import chart as report_chart

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
