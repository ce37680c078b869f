"""Errors that carry a message meant for the user: what is wrong, where, and what to do."""

from __future__ import annotations

# torch's DataPipes append this, and a repr of the whole pipeline (every argument, every shard's
# sha256 included), to the first argument of any exception raised while iterating them.
_DATAPIPE_NOTE = "\nThis exception is thrown by __iter__ of"


class FacebenchError(Exception):
    """Base of every error facebench reports to the user without a traceback."""

    def __str__(self) -> str:
        # The message alone (the first argument), without what DataPipes appended to it.
        text = str(self.args[0]) if self.args else ""
        return text.split(_DATAPIPE_NOTE, 1)[0]


class ConfigError(FacebenchError):
    """A config value is out of range or inconsistent."""


class DataError(FacebenchError):
    """The dataset on disk is missing, malformed or inconsistent."""


class ShardError(FacebenchError):
    """Shards are missing, incomplete, or do not match their manifest."""


class StorageError(FacebenchError):
    """An object store cannot be reached, refuses a request, or lacks an object it should hold."""


class ObjectMissing(StorageError):
    """No object at an address that was listed or named: deleted since, or never uploaded."""


class TrackingError(FacebenchError):
    """The MLflow store cannot be used."""


class TrackingLost(TrackingError):
    """The job finished, but MLflow failed during its run: what it recorded is in results.json
    only, for `python -m facebench.upload`. Its own exit status, so that a sweep or a scheduler
    can tell it from a failed measurement."""

    exit_code = 3


class LoaderFailure(FacebenchError):
    """A loader's workers, or the channel that brings their batches, stopped working."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: what the user sees is one line, what stopped and what was kept."""

    def __init__(self, signal_name: str, outcome: str) -> None:
        super().__init__(signal_name, outcome)
        self.signal_name = signal_name
        self.outcome = outcome

    def __str__(self) -> str:
        return f"interrupted by {self.signal_name}: {self.outcome}"

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process ended by the signal: 128 + its number."""
        return 128 + (15 if self.signal_name == "SIGTERM" else 2)

    @classmethod
    def of(cls, stop: KeyboardInterrupt, outcome: str) -> Interrupted:
        """From the KeyboardInterrupt that stopped the job: Ctrl-C's carries nothing; the one
        facebench raises on SIGTERM (facebench.run.entry) carries the signal's name."""
        if isinstance(stop, Interrupted):
            return stop
        name = stop.args[0] if stop.args and isinstance(stop.args[0], str) else "SIGINT"
        return cls(name, outcome)


def interruption(error: BaseException | None) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind an error, if any: one that arrived during clean-up can be
    replaced by an error of the clean-up itself (a thread not yet started, say)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
