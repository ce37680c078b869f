"""facebench: which data-loading pipeline keeps the GPU busy, and why."""

__version__ = "0.1.0"
