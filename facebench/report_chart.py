"""report.png: a sweep's table as bars, grouped by n_workers, beside the compute ceiling; and
the colour each loader keeps in every chart."""

from __future__ import annotations

import textwrap
from pathlib import Path

from facebench.report import CEILING, Settings, Table, article_table, ceiling_of, ordered, title


def loader_colour(column: str) -> str:
    """A loader keeps its colour in every panel and chart: its place among the loaders."""
    from facebench import loaders  # the registry (imported when a chart is drawn)

    names = loaders.names(real_only=True)
    name = column.split(" (")[0]
    return f"C{names.index(name) % 9}" if name in names else "C9"


def _panel(axis, table: Table, heading: str) -> None:
    """Horizontal bars, grouped by n_workers (ascending, top down), each labelled with its
    images/s; the compute ceiling is a line, not a bar."""
    loaders = ordered({loader for row in table.values() for loader in row if loader != CEILING})
    labels, values, colors = [], [], []
    for workers in sorted(table):
        for loader in loaders:
            if loader in table[workers]:
                labels.append(f"{loader}, {workers} workers")
                values.append(table[workers][loader].images_per_s)
                colors.append(loader_colour(loader))
    positions = list(range(len(values)))[::-1]
    bars = axis.barh(positions, values, color=colors)
    axis.bar_label(bars, labels=[f"{value:,.0f}" for value in values], padding=3, fontsize=8)
    axis.set_yticks(positions, labels, fontsize=8)
    ceiling = ceiling_of(table)
    if ceiling:
        axis.axvline(ceiling, color="black", linestyle="--", linewidth=1)
        axis.text(ceiling, len(values) - 0.7, f" compute ceiling\n {ceiling:,.0f}", fontsize=8)
    axis.set_xlim(0, 1.18 * max([*values, ceiling or 0]))
    axis.set_xlabel("images/s (whole epoch, start-up included)")
    axis.set_title("\n".join(textwrap.wrap(heading, 90)), fontsize=9, loc="left")


def chart(grouped: dict[Settings, Table], path: Path, with_article: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(title(settings), table) for settings, table in grouped.items()]
    if with_article:
        heading = "The article: 922,599 images, batch 600, RTX 2080 Ti (its seconds, as img/s)"
        panels.append((heading, article_table()))
    heights = [1.2 + 0.28 * sum(len(row) for row in table.values()) for _, table in panels]
    figure, axes = plt.subplots(
        len(panels), 1, figsize=(10, sum(heights)), squeeze=False, height_ratios=heights
    )
    for axis, (heading, table) in zip(axes[:, 0], panels, strict=True):
        _panel(axis, table, heading)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
