"""File names as the file system holds them, shown in text that any log, terminal or store takes.

A name that is not valid UTF-8 (bytes such as 0xff 0xfe, common on disks written by other
systems) reaches Python as a str with surrogate escapes ('\\udcff'), and the OS takes it back
unchanged: facebench keeps every name that way, opens and compares it as it is, and hashes its
bytes (os.fsencode). Only where a name becomes text that must be valid UTF-8 (a log line, an
MLflow param, a JSON artifact) is it shown with its odd bytes written out, as '\\xff'.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any


def printable(text: str) -> str:
    """text, with each byte that is not UTF-8 written as \\xNN (text itself when it is valid)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # surrogates that no file name gave: written as \udcNN
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def printable_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping whose str keys and values are printable (for params and JSON artifacts)."""
    return {
        printable(str(key)): printable(value) if isinstance(value, str) else value
        for key, value in values.items()
    }


class PrintableRecords(logging.Filter):
    """Makes each log record's message printable, so that a file name with odd bytes is logged
    rather than failing the handler ('--- Logging error ---' and a traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = printable(message)
        if shown is not message:
            record.msg, record.args = shown, None
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Filter every handler of `logger` (the root logger by default), once."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, PrintableRecords) for f in handler.filters):
            handler.addFilter(PrintableRecords())
