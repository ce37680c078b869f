"""Credentials, the standard AWS way, and where they came from (never what they are).

botocore's chain finds them as every AWS tool does: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY,
the shared credentials file, a profile of ~/.aws/config (AWS_PROFILE, or storage.profile), an
instance's role. The clients resolve them the same way themselves; this only checks, before any
run opens, that some are there, and names their source for the run's tags.
"""

from __future__ import annotations

import logging

from facebench.errors import StorageError
from facebench.host.extras import Requirement

# botocore says at INFO where it found them, once per client; the run's tag says it once.
logging.getLogger("botocore.credentials").setLevel(logging.WARNING)


# What storage=s3 needs beside storage.client's library: boto3, for listings and uploads.
BOTO3 = Requirement("boto3", "s3")


def credentials_source(profile: str = "", client: str = "crt") -> str:
    """Where the chain found credentials: env, shared-credentials-file, config-file, iam-role,
    sso, ... (botocore's name for the provider). Refuses first, in one line naming the extra,
    if boto3 or storage.client's library is missing."""
    from facebench.storage import clients

    BOTO3.require("storage=s3")
    library = clients.module(client)
    getattr(library, "refusal", lambda endpoint=None: None)()
    library.REQUIREMENT.require(f"storage.client={client}")
    import botocore.exceptions
    import botocore.session

    session = botocore.session.Session(profile=profile or None)
    try:
        found = session.get_credentials()
    except botocore.exceptions.ProfileNotFound:
        raise StorageError(
            f"storage.profile={profile}: no such profile in ~/.aws/credentials or ~/.aws/config"
        ) from None
    except botocore.exceptions.BotoCoreError as error:
        raise StorageError(f"AWS credentials could not be read: {error}") from None
    if found is None:
        raise StorageError(
            "no AWS credentials found: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "name a profile of ~/.aws/credentials with storage.profile=NAME (the local server "
            "prints its keys: python -m facebench.storage.server status)"
        )
    return str(found.method)


def keys(profile: str = "") -> dict[str, str]:
    """The credentials the chain finds, as the environment names them, for a process of the
    job's own that must check signatures made with them (the relay); never logged."""
    import botocore.session

    found = botocore.session.Session(profile=profile or None).get_credentials()
    if found is None:
        credentials_source(profile)  # says what is missing, in one line
    frozen = found.get_frozen_credentials()
    named = {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
    if frozen.token:
        named["AWS_SESSION_TOKEN"] = frozen.token
    return named
