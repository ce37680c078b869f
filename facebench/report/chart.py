"""report.png: a sweep's table as bars, grouped by n_workers, beside the compute ceiling, with
where each image's time went in stacked bars; the colour each loader and each stage keeps."""

from __future__ import annotations

import textwrap
from pathlib import Path

from facebench.report.sweep_table import (
    CEILING,
    Cell,
    Settings,
    Table,
    article_table,
    ceiling_of,
    ordered,
    title,
)
from facebench.stages import WORKER_STAGES


def loader_colour(column: str) -> str:
    """A loader keeps its colour in every panel and chart: its place among the loaders."""
    from facebench import loaders  # the registry (imported when a chart is drawn)

    names = loaders.names(real_only=True)
    name = column.split(" (")[0]
    return f"C{names.index(name) % 9}" if name in names else "C9"


# One colour per stage, the same in every chart.
STAGE_COLOURS = {
    "read": "#4c72b0",
    "decode": "#dd8452",
    "load": "#c44e52",
    "transform": "#55a868",
    "collate": "#8172b3",
}


def _rows(table: Table) -> list[tuple[str, int, Cell]]:
    """(loader, n_workers, cell), top down: grouped by n_workers (ascending), loaders in the
    report's order; the compute ceiling is not a row."""
    loaders = ordered({loader for row in table.values() for loader in row if loader != CEILING})
    return [
        (loader, workers, table[workers][loader])
        for workers in sorted(table)
        for loader in loaders
        if loader in table[workers]
    ]


def _panel(axis, table: Table, heading: str) -> None:
    """Horizontal bars, one per row, each labelled with its images/s; the compute ceiling is a
    line, not a bar."""
    rows = _rows(table)
    values = [cell.images_per_s for _, _, cell in rows]
    positions = list(range(len(rows)))[::-1]
    colours = [loader_colour(loader) for loader, _, _ in rows]
    bars = axis.barh(positions, values, color=colours)
    axis.bar_label(bars, labels=[f"{value:,.0f}" for value in values], padding=3, fontsize=8)
    labels = [f"{loader}, {workers} workers" for loader, workers, _ in rows]
    axis.set_yticks(positions, labels, fontsize=8)
    ceiling = ceiling_of(table)
    label = "images/s (whole epoch, start-up included)"
    if ceiling:
        # Named in the axis label, not beside the line, where it would cover bars and labels.
        axis.axvline(ceiling, color="black", linestyle="--", linewidth=1)
        label += f"; dashed line: the compute ceiling, {ceiling:,.0f}"
    axis.set_xlabel(label, fontsize=8)
    axis.xaxis.set_major_formatter("{x:,.0f}")
    axis.set_title("\n".join(textwrap.wrap(heading, 90)), fontsize=9, loc="left")


def _stage_panel(axis, table: Table) -> None:
    """One stacked bar per row beside the row's rate: the workers' CPU time per image, by
    stage, labelled with its total; then, apart and hatched, the time they waited inside the
    stages (for a core or storage), which is not a cost of the loader's work."""
    rows = _rows(table)
    positions = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for name in WORKER_STAGES:
        widths = [cell.stages.get(name, 0.0) for _, _, cell in rows]
        axis.barh(positions, widths, left=left, color=STAGE_COLOURS[name], label=name)
        left = [start + width for start, width in zip(left, widths, strict=True)]
    cpu = list(left)
    waited = [cell.waited_us or 0.0 for _, _, cell in rows]
    axis.barh(
        positions,
        waited,
        left=left,
        color="white",
        edgecolor="#999999",
        hatch="///",
        label="waited",
        linewidth=0.5,
    )
    left = [start + width for start, width in zip(left, waited, strict=True)]
    for position, total, end, (_, _, cell) in zip(positions, cpu, left, rows, strict=True):
        text = f" {total:,.0f}" if cell.stages else " not broken down"
        axis.text(end, position, text, va="center", fontsize=8)
    axis.set_yticks(positions, [""] * len(rows))
    axis.set_xlim(0, 1.25 * max(left, default=0) or 1)
    axis.set_xlabel("us per image, summed over the workers", fontsize=8)
    axis.xaxis.set_major_formatter("{x:,.0f}")
    axis.set_title(
        "Workers' CPU time per image, by stage (the number: its total);\n"
        "hatched: time they waited inside the stages, for a core or storage",
        fontsize=9,
        loc="left",
    )
    # Right of the bars: inside, it would cover the longest; above, the title.
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def chart(grouped: dict[Settings, Table], path: Path, with_article: bool) -> None:
    """Per settings group, its rates and, beside them, where each image's time went; the
    article's rates below, when asked for (it measured no stages)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(title(settings), table) for settings, table in grouped.items()]
    if with_article:
        heading = "The article: 922,599 images, batch 600, RTX 2080 Ti (its seconds, as img/s)"
        panels.append((heading, article_table()))
    # Room for each panel's title, and for the legend above the stage bars.
    heights = [1.6 + 0.3 * len(_rows(table)) for _, table in panels]
    figure, axes = plt.subplots(
        len(panels),
        2,
        figsize=(15, sum(heights)),
        squeeze=False,
        height_ratios=heights,
        width_ratios=[3, 2],
    )
    # One linear scale for every rates panel (the article's too): bars compare across panels.
    top = max(
        max([cell.images_per_s for _, _, cell in _rows(table)] + [ceiling_of(table) or 0])
        for _, table in panels
    )
    for (rates, stages), (heading, table) in zip(axes, panels, strict=True):
        _panel(rates, table, heading)
        rates.set_xlim(0, 1.15 * top)
        if any(cell.stages for _, _, cell in _rows(table)):
            _stage_panel(stages, table)
        else:
            stages.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
