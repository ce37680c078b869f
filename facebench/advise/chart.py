"""advice.png: each loader's best host-side rate beside the model's pace."""

from __future__ import annotations

from pathlib import Path

from facebench.advise.answer import Advice
from facebench.report_chart import loader_colour


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
        f"{v:,.0f} ({w} worker{'s' * (w != 1)})" for v, w in zip(values, workers, strict=True)
    ]
    axis.bar_label(bars, labels=labels, padding=3, fontsize=8)
    axis.set_yticks(positions, names)
    axis.axvline(advice.ceiling, color="black", linestyle="--", linewidth=1)
    label = f" {advice.model}: {advice.ceiling:,.0f}"
    axis.text(advice.ceiling, len(names) - 0.55, label, fontsize=8)
    spread = max([*values, advice.ceiling]) / max(1.0, min([*values, advice.ceiling]))
    if spread > 20:  # a CPU's model and a raw loader differ a thousandfold
        axis.set_xscale("log")
        axis.set_xlim(min([*values, advice.ceiling]) / 2, 4 * max([*values, advice.ceiling]))
    else:
        axis.set_xlim(0, 1.3 * max([*values, advice.ceiling]))
    axis.set_xlabel("images/s: each loader's host side at its best worker count, and the model")
    axis.set_title(f"Which loader keeps {advice.model} on {advice.device} fed", loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
