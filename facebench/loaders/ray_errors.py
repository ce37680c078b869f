"""Ray's errors in an epoch of loader=raydata, as the one line facebench reports."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from facebench.errors import FacebenchError, LoaderFailure
from facebench.loaders.ray_cluster import first_line


class BatchFailed(Exception):
    """A batch's error, carried out of a Ray task whole: its first argument is the error (Ray
    appends its own words to a string argument)."""


@contextmanager
def ray_errors() -> Iterator[None]:
    """Ray's errors in the epoch, as the one line facebench reports: a batch's own error (a
    file that does not decode) as it was raised in the task; a dead worker or node as a
    LoaderFailure that says what to do."""
    from ray.exceptions import NodeDiedError, RayError, RayTaskError, WorkerCrashedError

    try:
        yield
    except RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, BatchFailed) and cause.args:
            raise cause.args[0] from None
        if isinstance(cause, (WorkerCrashedError, NodeDiedError)):
            raise _died(cause) from None
        raise LoaderFailure(f"loader=raydata: a Ray task failed ({first_line(error)})") from None
    except (WorkerCrashedError, NodeDiedError) as error:
        raise _died(error) from None
    except RayError as error:
        raise LoaderFailure(f"loader=raydata: Ray failed mid-epoch ({first_line(error)})") from None


def _died(error: Exception) -> FacebenchError:
    who = "a Ray node" if "Node" in type(error).__name__ else "a Ray worker process"
    return LoaderFailure(
        f"loader=raydata: {who} died while decoding a batch (Ray: {first_line(error)}); it may "
        "have been killed (the out-of-memory killer: see `dmesg` on its machine) or crashed "
        "(its log: python-core-worker-*.log in /tmp/ray/session_latest/logs); use fewer "
        "n_workers or a smaller batch_size, or let Ray run a lost batch again: "
        "loader.max_retries=3"
    )
