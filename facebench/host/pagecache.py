"""The OS page cache: evict a run's files (cold) or read them in first (warm), and check which.

File-based loaders are orders of magnitude faster on cached files, so a run that does not control
the cache measures whatever the previous run left behind; the article's 5- and 10-worker numbers,
which disagree by 3x in opposite directions, look like that. Eviction uses posix_fadvise
DONTNEED, which needs no root but only drops clean pages, so files are flushed first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

from facebench.config import CacheMode, choice

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def evict(paths: Iterable[str | Path]) -> int:
    """Drop the files' pages from the page cache; returns how many files were evicted."""
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


def warm(paths: Iterable[str | Path]) -> int:
    """Read the files once so that their pages are cached; returns the bytes read."""
    total = 0
    buffer = bytearray(_CHUNK)
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            while n := file.readinto(buffer):
                total += n
    return total


class _Libc:
    """mmap, mincore and munmap from libc: Python's mmap module exposes no address for mincore."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.mmap = libc.mmap
        self.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self.mmap.restype = ctypes.c_void_p
        self.mincore = libc.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        self.mincore.restype = ctypes.c_int
        self.munmap = libc.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.munmap.restype = ctypes.c_int


_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_fraction(paths: Iterable[str | Path]) -> float:
    """Share of the files' pages now in the page cache (mincore), 0..1."""
    libc = _Libc()
    page = mmap.PAGESIZE
    resident = pages = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        n_pages = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if address in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), f"mmap failed on {path}")
            try:
                vector = (ctypes.c_ubyte * n_pages)()
                if libc.mincore(address, size, vector) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
                resident += sum(byte & 1 for byte in vector)
            finally:
                libc.munmap(address, size)
        finally:
            os.close(fd)
        pages += n_pages
    return resident / pages if pages else 1.0


def set_page_cache(mode: str, paths: list[str]) -> None:
    """Put the run's files in the requested cache state (a CacheMode)."""
    mode = choice(CacheMode, mode, "cache")
    if mode == CacheMode.cold:
        evict(paths)
    elif mode == CacheMode.warm:
        warm(paths)
