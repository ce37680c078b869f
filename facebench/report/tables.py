"""Tables as facebench prints them: Markdown for reports, advice and docs/benchmarks.md, and
aligned plain text for a terminal (a sweep's summary). One place, so that every table reads the
same and a change of style is one change."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table, one line each for the header, its rule and every row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def aligned(header: Sequence[str], rows: Iterable[Sequence[str]], right: set[int]) -> str:
    """A plain-text table, columns padded to their widest cell; the columns in `right`
    (numbers) right-aligned."""
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    )
