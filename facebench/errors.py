"""Errors that carry a message meant for the user: what is wrong, where, and what to do."""


class FacebenchError(Exception):
    """Base of every error facebench reports to the user without a traceback."""


class ConfigError(FacebenchError):
    """A config value is out of range or inconsistent."""


class DataError(FacebenchError):
    """The dataset on disk is missing, malformed or inconsistent."""


class ShardError(FacebenchError):
    """Shards are missing, incomplete, or do not match their manifest."""


class TrackingError(FacebenchError):
    """The MLflow store cannot be used."""
