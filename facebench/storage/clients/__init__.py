"""The S3 client libraries each image's GET can go through (storage.client), one module each.

Every module holds the same things, so that adding a client is one module and one name in
config/choices.py (S3Client):

    REQUIREMENT                          # the package it imports, and the extra that installs it
    make(endpoint) -> client             # one per process, shared by its GET threads
    fetch(client, bucket, key, byte_range, start_ns) -> (bytes, first byte ns after start_ns)
    errors() -> exception types          # what a failed GET raises; classified by its message
    FORK_SAFE = False                    # where its runtime does not survive a fork (below)

storage/client.py makes the client once per process (never across a fork), retries, counts and
words failures the same way for every library: each client is told to try once.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from facebench.config.choices import S3Client
from facebench.errors import StorageError


def module(name: S3Client | str) -> ModuleType:
    """The module of a client library, by its storage.client name."""
    return importlib.import_module(f"facebench.storage.clients.{S3Client(name).value}")


# Libraries whose requests run on a runtime of the process's own (obstore's and s3dlio's tokio):
# a process forked after using one inherits a runtime without its threads, and its first request
# would wait forever. Their modules say FORK_SAFE = False.
_used: set[str] = set()
_inherited: set[str] = set()


def _forked() -> None:
    _inherited.update(_used)
    _used.clear()


os.register_at_fork(after_in_child=_forked)


def make(name: str, endpoint: Any) -> Any:
    """A client of library `name` for this process, refused in one line where this process was
    forked from one that had used that library (a wait forever, else)."""
    library = module(name)
    if not getattr(library, "FORK_SAFE", True):
        if name in _inherited:
            raise StorageError(
                f"storage.client={name}: this worker was forked from a process that had used "
                f"{name}, whose runtime does not survive a fork. Run each job in a process of "
                "its own (a sweep whose jobs mix n_workers=0 with workers: start them apart), or "
                "use storage.client=crt or boto3"
            )
        _used.add(name)
    return library.make(endpoint)
