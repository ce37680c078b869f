"""Errors that carry a message meant for the user: what is wrong, where, and what to do."""

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


class TrackingError(FacebenchError):
    """The MLflow store cannot be used."""


class LoaderFailure(FacebenchError):
    """A loader's workers, or the channel that brings their batches, stopped working."""
