"""A sweep's tables in Markdown: the article's layout (rows n_workers, columns loaders, a cell's
epoch seconds, images/s and share of the compute ceiling), notes on shard sizes and repeats, and
where each run's workers spent their CPU time, stage by stage."""

from __future__ import annotations

from facebench.host.resources import CONTAINER_TAGS
from facebench.report.sweep_table import (
    ARTICLE_IMAGES,
    ARTICLE_LOADERS,
    ARTICLE_SECONDS,
    CEILING,
    Cell,
    Settings,
    Table,
    ceiling_of,
    ordered,
    title,
)
from facebench.report.tables import markdown
from facebench.stages import BUILT_IN_STAGES, WORKER_STAGES


def render_machines(tags: list[dict[str, str]]) -> str:
    """Where the runs measured: each distinct CPU, its usable cores and GPU, and the container
    limits that applied (a sweep in a 2-CPU container is not a sweep of the host)."""
    machines: dict[str, None] = {}
    for run in tags:
        text = f"{run.get('cpu', 'unknown CPU')}, {run.get('cpu_cores', '?')} cores"
        if run.get("gpu", "none") != "none":
            text += f", {run['gpu']}"
        limits = [run[key] for key in CONTAINER_TAGS if key in run]
        if limits:
            text += f" (within a {'; a '.join(limits)})"
        machines[text] = None
    return f"Measured on {'; '.join(machines)}.\n\n" if machines else ""


def render(settings: Settings, table: Table) -> str:
    """One settings group as a Markdown table: rows n_workers, columns loaders."""
    loaders = ordered({loader for row in table.values() for loader in row if loader != CEILING})
    ceiling = ceiling_of(table)
    rows = [
        [str(workers), *(_cell(table[workers].get(loader), ceiling) for loader in loaders)]
        for workers in sorted(table)
    ]
    text = f"### {title(settings)}\n\n" + markdown(["n workers", *loaders], rows)
    notes = _notes(table, ceiling)
    return text + ("\n" + " ".join(notes) + "\n" if notes else "") + _render_stages(table)


def _cell(cell: Cell | None, ceiling: float | None) -> str:
    if cell is None:
        return "not run"
    text = f"{cell.epoch_s:,.1f} s, {cell.images_per_s:,.0f} img/s"
    if ceiling:
        text += f", {100 * cell.images_per_s / ceiling:.0f}% of ceiling"
    if cell.au is not None:
        text += f", AU {cell.au:.0%}"
    if cell.epoch_usd is not None:
        text += f", ${cell.epoch_usd:,.4g}/epoch"
    return text


def _notes(table: Table, ceiling: float | None) -> list[str]:
    """What the cells do not say: the compute ceiling, the shard sizes runs used, repeats."""
    notes = []
    if ceiling:
        notes.append(f"Compute ceiling (loader={CEILING}): {ceiling:,.0f} img/s.")
    shards = [
        f"{loader} with {workers} workers: {cell.shard_size_used:,}"
        for workers in sorted(table)
        for loader, cell in table[workers].items()
        if cell.shard_size_used is not None
    ]
    if shards:
        notes.append("Samples per shard (`shard_size_used`): " + "; ".join(shards) + ".")
    if any(cell.au is not None for row in table.values() for cell in row.values()):
        # The two rates cover different spans; beside each other they would seem to disagree.
        notes.append(
            "AU is the accelerators' computing time over the time after their first step; "
            "img/s is the whole epoch, start-up included."
        )
    repeats = {cell.repeats for row in table.values() for cell in row.values()}
    if max(repeats, default=1) > 1:
        notes.append("Cells are medians over each job's measured epochs.")
    return notes


def _render_stages(table: Table) -> str:
    """Where each image's time went in the workers, per loader and n_workers."""
    found = [
        (loader, workers, cell)
        for workers in sorted(table)
        for loader in ordered(set(table[workers]))
        if (cell := table[workers][loader]).stages
    ]
    if not found:
        return ""
    rows = []
    # `load` is a custom loader's own sample code: a column only where a run had some.
    loaded = any(cell.stages.get("load", 0.0) > 0 for _, _, cell in found)
    columns = WORKER_STAGES if loaded else BUILT_IN_STAGES
    for loader, workers, cell in found:
        top = max(cell.stages, key=cell.stages.__getitem__)
        values = [
            (f"**{us:,.0f}**" if name == top else f"{us:,.0f}")
            for name, us in ((name, cell.stages.get(name, 0.0)) for name in columns)
        ]
        waited = f"{cell.waited_us:,.0f}" if cell.waited_us is not None else "-"
        rows.append([loader, str(workers), *values, waited])
    named = [
        f"- {loader}, {workers} workers: "
        + ", ".join(f"{name} {share:.0%}" for name, share in cell.parts)
        for loader, workers, cell in found
        if cell.parts
    ]
    inside = (
        "\n\nInside custom loaders, each transform's share of the stages' time:\n\n"
        + "\n".join(named)
        if named
        else ""
    )
    return (
        "\nWhere each image's time went: the workers' CPU time per image in each stage, in "
        "microseconds summed over the workers (each run's last epoch; the costliest stage in "
        "bold), and the time they waited inside the stages for a core or storage:\n\n"
        + markdown(["loader", "n workers", *columns, "waited"], rows)
        + inside
    )


def render_article() -> str:
    """The article's own numbers, as a table of their own."""
    rows = [
        [
            str(workers),
            *(
                f"{seconds:,} s, {ARTICLE_IMAGES / seconds:,.0f} img/s"
                for seconds in (ARTICLE_SECONDS[workers][name] for name in ARTICLE_LOADERS)
            ),
        ]
        for workers in sorted(ARTICLE_SECONDS)
    ]
    return (
        "### The article: one epoch of 922,599 images, batch 600, RTX 2080 Ti, i9-9900K\n\n"
        + markdown(["n workers", *ARTICLE_LOADERS], rows)
    )
