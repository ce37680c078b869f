"""advice.png: each loader's best host-side rate beside the model's pace."""

from __future__ import annotations

from pathlib import Path

from facebench.advise.answer import Advice
from facebench.report.chart import loader_colour


def chart(advice: Advice, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [m for m in advice.ordered() if m.rates]
    names = [m.name for m in measured]
    values = [m.best()[1] for m in measured]
    figure, axis = plt.subplots(figsize=(9, 1.4 + 0.45 * len(names)))
    positions = list(range(len(names)))[::-1]
    bars = axis.barh(positions, values, color=[loader_colour(name) for name in names])
    workers = [m.best()[0] for m in measured]
    labels = [
        f"{v:,.0f} ({w} worker{'s' * (w != 1)}), {_pace(v, advice.ceiling)}"
        for v, w in zip(values, workers, strict=True)
    ]
    for text in axis.bar_label(bars, labels=labels, padding=3, fontsize=8):
        text.set_bbox({"facecolor": "white", "edgecolor": "none", "pad": 1})  # over the line
    axis.set_yticks(positions, names)
    # A linear axis: bars are compared with each other, and a log axis made a 60x gap look 2x.
    # The model's pace is a line named in the axis label (a label beside it covered bars).
    axis.axvline(advice.ceiling, color="black", linestyle="--", linewidth=1)
    axis.set_xlim(0, 1.6 * max([*values, advice.ceiling]))
    axis.xaxis.set_major_formatter("{x:,.0f}")
    axis.set_xlabel(
        "images/s: each loader's host side at its best worker count; dashed line: "
        f"{advice.model}'s pace, {advice.ceiling:,.0f}",
        fontsize=9,
    )
    axis.set_title(f"Which loader keeps {advice.model} on {advice.device} fed", loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _pace(rate: float, ceiling: float) -> str:
    """'3.2x the model's pace', '40% of the model's pace'."""
    ratio = rate / ceiling if ceiling > 0 else float("inf")
    if ratio >= 1:
        return f"{ratio:,.1f}x the model's pace"
    return f"{100 * ratio:.0f}% of the model's pace"
