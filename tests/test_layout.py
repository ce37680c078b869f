"""The code stays readable: no function in facebench/ or bench/ longer than a screen."""

from __future__ import annotations

import ast

from facebench.host.paths import PROJECT_ROOT

MAX_FUNCTION_LINES = 60
CHECKED = ("facebench", "bench")  # the package, and the benchmark scripts beside it


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
