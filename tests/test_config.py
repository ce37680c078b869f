"""A bucket's distance has one list of limits (config/schema.py DistanceConfig): the storage keys,
the config's checks, the relay's options and Distance all read every field of it, so a limit
added there reaches each of them."""

from __future__ import annotations

import dataclasses

import pytest

from facebench.config import DistanceConfig, StorageConfig
from facebench.errors import ConfigError
from facebench.storage import relay
from facebench.storage.distance import FIELDS, Distance

NAMES = tuple(field.name for field in dataclasses.fields(DistanceConfig))
# Each field a value of its own, so one read in place of another shows.
EACH = {name: float(10 * (index + 1)) for index, name in enumerate(NAMES)}


def test_the_storage_keys_and_the_distance_are_the_one_list() -> None:
    storage_keys = {field.name for field in dataclasses.fields(StorageConfig)}
    assert set(NAMES) <= storage_keys  # flat: storage.latency_ms, not storage.distance.*
    assert FIELDS == NAMES
    assert tuple(field.name for field in dataclasses.fields(Distance)) == NAMES


def test_distance_of_reads_every_field() -> None:
    assert dataclasses.asdict(Distance.of(StorageConfig(**EACH))) == EACH


def test_the_relay_takes_every_field_as_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Distance] = []

    async def start(args: object, distance: Distance) -> None:
        started.append(distance)  # in place of serving: what the relay would emulate

    monkeypatch.setattr(relay, "_main", start)
    relay.main(["--upstream=http://127.0.0.1:1", *Distance(**EACH).arguments()])
    assert started == [Distance(**EACH)]


def test_a_tail_below_its_median_is_one_line_at_config_time(make_cfg) -> None:
    bucket = ["storage=s3", "storage.url=s3://facebench/x", "storage.endpoint=http://127.0.0.1:1"]
    with pytest.raises(ConfigError) as refused:
        make_cfg(*bucket, "storage.latency_ms=20", "storage.latency_p99_ms=10")
    assert str(refused.value) == (
        "invalid config: storage.latency_p99_ms=10.0: below storage.latency_ms=20.0, the median; "
        "give a 99th percentile at or above it, or 0 for a constant latency"
    )
    make_cfg(*bucket, "storage.latency_ms=20", "storage.latency_p99_ms=0")  # constant: fine


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_described(name: str) -> None:
    assert Distance(**{name: 7.0}).describe()


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_checked(name: str, make_cfg) -> None:
    with pytest.raises(ConfigError, match=rf"storage.{name}: a bucket's distance, for storage=s3"):
        make_cfg(f"storage.{name}=1")
    bucket = ["storage=s3", "storage.url=s3://facebench/x", "storage.endpoint=http://127.0.0.1:1"]
    with pytest.raises(ConfigError, match=rf"storage.{name}=-1.0: must be 0 \(off\) or more"):
        make_cfg(*bucket, f"storage.{name}=-1")
