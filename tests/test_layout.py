"""The code stays readable: no function in facebench/ or bench/ longer than a screen, and no module
of facebench/ longer than a page or so."""

from __future__ import annotations

import ast
from pathlib import Path

from facebench.host.paths import PROJECT_ROOT

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 300
CHECKED = ("facebench", "bench")  # the package, and the benchmark scripts beside it
PACKAGE = "facebench"  # modules are held to a page in the package; a bench script may run longer


def long_modules(root: Path, most: int = MAX_MODULE_LINES) -> list[str]:
    """Each module under `root` longer than `most` lines, as "path (N lines)", longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > most:
            found.append((lines, f"{path.relative_to(root.parent)} ({lines} lines)"))
    return [text for _, text in sorted(found, key=lambda item: -item[0])]


def test_no_function_is_longer_than_sixty_lines():
    long = []
    for folder in CHECKED:
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {node.name}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_module_of_the_package_is_longer_than_three_hundred_lines():
    long = long_modules(PROJECT_ROOT / PACKAGE)
    assert not long, (
        f"modules over {MAX_MODULE_LINES} lines (split each where its ideas divide): "
        + ", ".join(long)
    )


def test_a_long_module_is_named_with_its_length(tmp_path):
    package = tmp_path / PACKAGE
    (package / "room").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (package / "room" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "longer.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 5))
    assert long_modules(package) == [
        f"{PACKAGE}/longer.py ({MAX_MODULE_LINES + 5} lines)",
        f"{PACKAGE}/room/long.py ({MAX_MODULE_LINES + 1} lines)",
    ]
