"""A bucket's distance, emulated: what stands between the clients and an S3 endpoint (latency,
bandwidth, a request rate), the job's relay that adds it (facebench/storage/relay.py, started
and ended here with the job), and the relay's counters read as the run's metrics.

Every loader's client (boto3, the CRT client, LitData's, Ray's tasks) speaks plain HTTP/1.1 to
the relay as to the endpoint; the kernel's netem would do this below them, but containers lack
it. Only plain http:// endpoints can be relayed (a TLS one would need its certificate).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from facebench.config import DistanceConfig
from facebench.errors import StorageError
from facebench.fetches import percentile_ms
from facebench.host.children import Child, spawn
from facebench.host.realtime import say_relay_not_realtime
from facebench.storage.address import parse
from facebench.storage.credentials import keys

log = logging.getLogger(__name__)

# A relay the job's parent started for all its ranks (accelerators_per_host): the host's link
# and the prefix's request rate are shared by every rank, as on a real host.
RELAY_ENV = "FACEBENCH_RELAY"


class Distance(DistanceConfig):
    """What stands between the clients and the endpoint; 0 turns a limit off. Its fields are
    DistanceConfig's (the config's one list of a bucket's limits), inherited. Not frozen (a
    frozen dataclass cannot inherit a config's fields), it is still used as a value: made by
    Distance.of or from the relay's options, never changed."""

    @classmethod
    def of(cls, storage: Any) -> Distance:
        """The distance storage.* asks for (a StorageConfig, or any object with its fields)."""
        return cls(**{name: float(getattr(storage, name)) for name in FIELDS})

    @property
    def any(self) -> bool:
        return any(getattr(self, name) for name in FIELDS)

    def arguments(self) -> list[str]:
        """The relay's command-line options for this distance (its main reads the same list)."""
        return [f"--{option(name)}={getattr(self, name)}" for name in FIELDS]

    def describe(self) -> str:
        """'20 ms (p99 100 ms), 100 Mbit/s a connection, 3,500 requests/s' (what is on)."""
        parts = []
        if self.latency_ms or self.latency_p99_ms:
            tail = f" (p99 {self.latency_p99_ms:g} ms)" if self.latency_p99_ms else ""
            parts.append(f"{self.latency_ms:g} ms{tail}")
        if self.bandwidth_mbps:
            parts.append(f"{self.bandwidth_mbps:g} Mbit/s a connection")
        if self.total_mbps:
            parts.append(f"{self.total_mbps:g} Mbit/s in all")
        if self.requests_per_s:
            parts.append(f"{self.requests_per_s:,.0f} requests/s")
        return ", ".join(parts)


# The distance's fields, in order (DistanceConfig's): what the relay's options and Distance.of
# read, as the config's checks do.
FIELDS = tuple(field.name for field in dataclasses.fields(Distance))


def option(name: str) -> str:
    """A field's command-line option, without its dashes: latency_ms -> latency-ms."""
    return name.replace("_", "-")


_START_S = 15.0  # the relay's own start-up: an interpreter and asyncio, well under a second
_LISTENING = re.compile(r"listening on (\d+)")


@contextmanager
def emulated(storage: Any, folder: Path, seed: int = 0) -> Iterator[str]:
    """The job's relay in front of storage.endpoint, where storage.* asks for a distance: its
    address (empty where none is asked for). With storage.answers=copy, the bucket's copy in
    folder/bucket-copy/ is made current first (bucket_copy.py), outside every epoch. The relay
    dies with the job, however the job ends; its output goes to a log in `folder`, removed at
    the end unless the relay failed. `seed` seeds its drawn latencies."""
    distance = Distance.of(storage)
    if storage.name == "local" or not distance.any or not storage.emulate:
        yield ""
        return
    if not storage.endpoint.startswith("http://"):
        # A real bucket: its own distance is there already, and a relay could not speak TLS.
        log.info(
            "%s is read as it is: the emulated distance (%s) applies to a plain http:// "
            "endpoint only", storage.endpoint or "AWS's endpoint", describe(storage),
        )  # fmt: skip
        yield ""
        return
    if os.environ.get(RELAY_ENV):  # the ranks' parent runs it for them all
        yield os.environ[RELAY_ENV]
        return
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"distance-relay-{os.getpid()}.log"
    log_path.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "facebench.storage.relay", f"--upstream={storage.endpoint}",
        f"--seed={seed}", *distance.arguments(), *([] if storage.realtime else ["--fair"]),
    ]  # fmt: skip
    env = dict(os.environ)
    if storage.answers == "copy":
        copy_folder = _take_copy(storage, folder)
        command.append(f"--copy={copy_folder}")
        env.update(keys(storage.profile))  # to check signatures; never on a command line
    relay = spawn(command, log_path=log_path, env=env)
    try:
        port = _port_of(log_path, relay)
        if storage.realtime and not _realtime(f"http://127.0.0.1:{port}", log_path):
            say_relay_not_realtime()
        log.info(
            "emulating the bucket's distance (%s) with a relay at 127.0.0.1:%d in front of %s, "
            "answering from %s", describe(storage), port, storage.endpoint,
            "its copy" if storage.answers == "copy" else "the endpoint",
        )  # fmt: skip
        yield f"http://127.0.0.1:{port}"
    finally:
        relay.end()
    log_path.unlink(missing_ok=True)


def _take_copy(storage: Any, folder: Path) -> Path:
    """The copy of every object under storage.url, made current through the endpoint itself."""
    from facebench.storage.bucket_copy import refresh
    from facebench.storage.client import Endpoint, configure

    copy_folder = folder / "bucket-copy" / re.sub(r"[^\w.-]", "_", storage.endpoint[7:])
    configure(Endpoint.of(storage))  # the endpoint, not the relay: the job sets its own after
    found = refresh(parse(storage.url), copy_folder)
    log.info("the emulated bucket's copy: %s", found.describe(copy_folder))
    return copy_folder


def in_effect(storage: Any, via: str) -> Distance:
    """The distance a job's requests meet: the storage's, where its relay (`via`) runs; none
    where no relay does (local files, a real bucket, storage.emulate=false)."""
    return Distance.of(storage) if via else Distance()


def describe(storage: Any) -> str:
    """'S3 Standard, same region: 20 ms, 700 Mbit/s a connection, 5,500 requests/s'."""
    limits = Distance.of(storage).describe()
    return f"{storage.distance_name}: {limits}" if storage.distance_name else limits


def snapshot(via: str) -> dict[str, Any]:
    """The relay's counters so far (since it started): requests answered (from its copy, from
    the endpoint), refused, late, the endpoint's time, its CPU, and the latencies it drew and
    gave (fetches.py's buckets)."""
    with urllib.request.urlopen(f"{via}/__relay", timeout=5) as answer:
        return json.loads(answer.read())


def counters(via: str, since: dict[str, Any] | None = None) -> dict[str, float]:
    """What the job's relay did since `since` (a snapshot) or its start, as the run's metrics:
    requests and 503s, the share the endpoint answered (not the copy) and its mean time, the
    share answered late (after the drawn latency: the endpoint's answer, or the relay's own
    CPU, set the time), the relay's CPU (a share of its one core), whether it ran under
    real-time scheduling, and the latencies drawn (the profile's, as emulated) beside those
    given (the first bytes as they left)."""
    now, before = snapshot(via), since or {}
    realtime = float(bool(now.pop("realtime", False)))
    found = {name: _less(value, before.get(name)) for name, value in now.items()}
    answered = max(1, found["answered"])
    metrics = {
        "storage_relay_requests": float(found["answered"]),
        "storage_relay_503s": float(found["refused"]),
        "storage_relay_endpoint_frac": found["from_endpoint"] / answered,
        "storage_relay_late_frac": found["late"] / answered,
        "storage_relay_cpu_frac": found["cpu_s"] / max(1e-9, found["alive_s"]),
        "storage_emulated_mean_ms": 1000 * found["drawn_s"] / answered,
        "storage_relay_ttfb_mean_ms": 1000 * found["given_s"] / answered,
        "storage_relay_ready_mean_ms": 1000 * found["ready_s"] / answered,
        "storage_relay_behind_mean_ms": 1000 * found["behind_s"] / answered,
        "storage_relay_realtime": realtime,
    }
    if found["from_endpoint"]:
        metrics["storage_relay_endpoint_ms"] = 1000 * found["endpoint_s"] / found["from_endpoint"]
    for share in (50, 99):
        value = percentile_ms(found["drawn"], share / 100)
        if value is not None:
            metrics[f"storage_emulated_p{share}_ms"] = value
    return metrics


def _less(value: Any, earlier: Any) -> Any:
    """A counter's growth since a snapshot: a number's, or each bucket's of a histogram."""
    if isinstance(value, list):
        return [now - then for now, then in zip(value, earlier or [0] * len(value), strict=True)]
    return value - (earlier or 0)


def _realtime(via: str, log_path: Path) -> bool:
    """Whether the relay just started runs under real-time scheduling, as it says itself."""
    try:
        return bool(snapshot(via).get("realtime"))
    except OSError as error:  # it died, or does not answer, since it said where it listens
        said = f"the distance relay does not answer ({error}); its log: {log_path}"
        raise StorageError(said) from None


def _port_of(log_path: Path, relay: Child) -> int:
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        found = _LISTENING.search(text)
        if found:
            return int(found.group(1))
        if relay.process.poll() is not None:
            last = text.strip().splitlines()[-1] if text.strip() else "no output"
            raise StorageError(f"the distance relay did not start ({last}); its log: {log_path}")
        time.sleep(0.05)
    raise StorageError(f"the distance relay did not start in {_START_S:.0f} s; its log: {log_path}")
