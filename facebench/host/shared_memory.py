"""Will the batches a loader's worker processes hand over fit in shared memory (/dev/shm)?

A worker process hands each batch to the loop's process as a file in /dev/shm (torch's
file_descriptor sharing; DataLoader's, torchdata.nodes' and LitData's workers alike), and
several are in flight at once: each worker's `prefetch_factor` ready batches, the one the loop
holds, and any the pipeline keeps received ahead. Docker gives a container a 64 MB /dev/shm
unless started with --shm-size, less than one batch of 600 float32 crops (69 MiB): there the
first batch fails deep inside a worker. Checked before any epoch, in one line with both
numbers; `resource_check=false` starts the run anyway, and a run that runs out then (or
because another process filled /dev/shm) ends in one line too (`ran_out`).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from facebench.errors import ConfigError, LoaderFailure

SHM = Path("/dev/shm")
MIB = 2**20
_DOCKER_STEP = 64 * MIB  # --shm-size is suggested in steps of Docker's own default
_HEADROOM = 1.25  # for what else uses /dev/shm meanwhile (torch's own, other processes)
_PAGE = 4096
# A batch's labels, ids and crop offsets: int64s, each tensor a file of whole pages of its own.
_SMALL_PER_IMAGE, _SMALL_FILES = 4 * 8, 3
# Where a worker process passes a batch's file descriptors: a Unix socket multiprocessing makes
# in the temporary folder, $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX; its path must fit
# sockaddr_un's 108 bytes, the last a NUL.
_SOCKET_TAIL = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
_SOCKET_PATH_MOST = 107


@dataclass(frozen=True)
class Space:
    """A shared-memory file system: where, its size, and what is free now."""

    path: Path
    total: int
    free: int

    def describe(self) -> str:
        return f"{self.path} has {mib(self.free)} free (of {mib(self.total)})"


def space(path: Path = SHM) -> Space | None:
    """/dev/shm's size and free space; None where there is none (not Linux)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return Space(path, stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize)


@dataclass(frozen=True)
class InFlight:
    """The batches a loader's worker processes have in shared memory at once."""

    loader: str
    n_workers: int
    per_worker: int  # batches each worker has ready (DataLoader's: prefetch_factor)
    extra: int  # beyond the workers': held by the loop, received ahead
    batch_size: int
    image_bytes: int  # one image as handed over
    kind: str  # "float32 3x100x100", for the message
    ranks: int = 1  # processes on this machine, each with its own workers
    # What changes the loader's workers to threads, where it has that choice.
    thread_option: str = ""
    shallow: int | None = None  # the batches with loader.prefetch_factor=1

    @property
    def batches(self) -> int:
        return self.n_workers * self.per_worker + self.extra

    @property
    def batch_bytes(self) -> int:
        return _bytes(self.batch_size, self.image_bytes)

    @property
    def need(self) -> int:
        return self.ranks * self.batches * self.batch_bytes

    def fits(self, room: Space | None) -> bool:
        return room is None or self.need <= room.free

    def batches_fitting(self, free: int) -> int:
        return free // (self.ranks * self.batch_bytes)

    def describe(self) -> str:
        many = self.n_workers > 1
        workers = f"{self.n_workers} worker process{'es' if many else ''}"
        where = f" on each of {self.ranks} ranks" if self.ranks > 1 else ""
        return (
            f"its {workers}{where} hand{'' if many or where else 's'} batches over through "
            f"shared memory, up to {self.batches} batches of {self.batch_size} images "
            f"({self.kind}, {mib(self.batch_bytes)} each) at once{where and ' per rank'}: about "
            f"{mib(self.need)}{where and ' in all'}"
        )


def _bytes(batch_size: int, image_bytes: int) -> int:
    small = math.ceil(batch_size * _SMALL_PER_IMAGE / _PAGE) * _PAGE * _SMALL_FILES
    return batch_size * image_bytes + small


# The last check's estimate and suggestions, named again if the run runs out after all.
_expected: InFlight | None = None
_threaded: Callable[[], list[str]] = list


def check(
    in_flight: InFlight | None, threaded: Callable[[], list[str]], enabled: bool = True
) -> None:
    """Refuse, in one line naming both numbers and what to change, batches that do not fit.

    threaded: the loaders whose workers are threads (they need no shared memory), to suggest;
    asked only when refusing."""
    global _expected, _threaded
    _expected, _threaded = in_flight, threaded
    room = space()
    if not enabled or in_flight is None or in_flight.fits(room):
        return
    raise ConfigError(
        f"loader={in_flight.loader}: {in_flight.describe()}, but {room.describe()}. "
        f"{remedies(in_flight, room, threaded())}; resource_check=false starts it anyway"
    )


def remedies(
    in_flight: InFlight, room: Space, threaded: list[str], first: str = "Give it more"
) -> str:
    """What to change, each with a value that fits `room` where one does: a --shm-size for what
    else is in it and this run's batches, a batch_size, n_workers or prefetch_factor."""
    used = room.total - room.free
    size = math.ceil((used + in_flight.need) * _HEADROOM / _DOCKER_STEP) * _DOCKER_STEP
    said = [
        f"{first}: docker run --shm-size={size // MIB}m (a Kubernetes pod: an emptyDir with "
        "medium: Memory mounted at /dev/shm)"
    ]
    room_per_batch = room.free // (in_flight.ranks * in_flight.batches)
    batch_size = room_per_batch // in_flight.image_bytes
    while batch_size > 0 and _bytes(batch_size, in_flight.image_bytes) > room_per_batch:
        batch_size -= 1  # its labels, ids and offsets too
    if 0 < batch_size < in_flight.batch_size:
        said.append(f"batch_size={batch_size} or smaller")
    batches = in_flight.batches_fitting(room.free)
    workers = (batches - in_flight.extra) // in_flight.per_worker
    if 0 < workers < in_flight.n_workers:
        said.append(f"n_workers={workers}")
    shallow = in_flight.shallow
    if shallow is not None and shallow < in_flight.batches and shallow <= batches:
        said.append("loader.prefetch_factor=1")
    threads = [in_flight.thread_option] if in_flight.thread_option else []
    threads += [f"loader={name}" for name in threaded]
    if threads:
        said.append(f"workers that are threads ({', '.join(threads)})")
    return ", or ".join(said)


def full() -> bool:
    """Whether /dev/shm has a MiB or less free: too little for the next batch or semaphore."""
    room = space()
    return room is not None and room.free <= MIB


def ran_out(loader: str) -> LoaderFailure:
    """The one line for a run whose workers could not get the shared memory for a batch: more
    than /dev/shm holds (a run with resource_check=false), or another process filled it."""
    room = space()
    head = f"loader={loader}: its workers ran out of shared memory for a batch"
    if room is None:
        return LoaderFailure(f"{head}. Use workers that are threads, or n_workers=0")
    held = f"{room.path} holds {mib(room.total)} ({mib(room.free)} free now)"
    expected = _expected if _expected is not None and _expected.loader == loader else None
    if expected is None:
        return LoaderFailure(
            f"{head}: {held}. Give it more (docker run --shm-size), or use a smaller "
            "batch_size, fewer n_workers or loader.prefetch_factor, or workers that are threads"
        )
    whole = Space(room.path, room.total, room.total)  # /dev/shm to itself
    if not expected.fits(whole):
        said = remedies(expected, whole, _threaded())
        return LoaderFailure(f"{head}: {held}, and {expected.describe()}. {said}")
    said = remedies(expected, room, _threaded(), first="Free it, or give it more")
    return LoaderFailure(
        f"{head}: {held}, room for the {mib(expected.need)} its batches need at most, so "
        f"another process filled it (`ls -la {room.path}` shows what is there). {said}"
    )


def mib(size: int) -> str:
    return f"{size / MIB:,.1f} MiB"


def check_socket_folder(loader: str, folder: str | None = None) -> None:
    """Refuse a temporary folder too long for the workers' sockets: there a worker's first
    batch fails in its queue's feeder thread (`OSError: AF_UNIX path too long`), which the
    loop never hears of, and the epoch waits forever."""
    folder = folder or tempfile.gettempdir()
    longest = len(os.fsencode(folder)) + _SOCKET_TAIL
    if longest > _SOCKET_PATH_MOST:
        most = _SOCKET_PATH_MOST - _SOCKET_TAIL
        raise ConfigError(
            f"loader={loader}: the temporary folder {folder} ({longest - _SOCKET_TAIL} bytes, "
            f"from TMPDIR) is too long for the sockets its worker processes hand batches "
            f"through: their paths would pass the 108 bytes a Unix socket's may have. Set "
            f"TMPDIR to a folder of at most {most} bytes (export TMPDIR=/tmp), or n_workers=0"
        )
