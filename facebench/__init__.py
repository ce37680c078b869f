"""facebench: which data-loading pipeline keeps the GPU busy, and why.

`from facebench import watch` measures a training loop where it runs (facebench/watching/).
"""

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["watch"]


def __getattr__(name: str) -> Any:
    # Loaded when first asked for, by name: the package's root imports none of its rooms, so
    # that a worker process importing facebench.stages does not load what watch needs, and
    # every room may import the root without a circle.
    if name == "watch":
        return importlib.import_module("facebench.watching").watch
    raise AttributeError(f"module 'facebench' has no attribute {name!r}")
