"""Where facebench keeps things, independent of the working directory."""

from __future__ import annotations

from pathlib import Path

# The checkout that holds train.py; facebench is installed from it in editable mode.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def cache_dir(configured: str = "") -> Path:
    """Generated data and shards: outside git, reused across runs."""
    return Path(configured).expanduser().resolve() if configured else PROJECT_ROOT / ".cache"
