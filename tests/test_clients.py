"""The S3 client libraries a GET can go through (storage.client): every installed one reads the
same bytes, whole and in ranges, from the bundled server and from another S3 server (moto's),
directly and from the emulated bucket; a loader reads every sample once through each, with the
same labels and pixels; each failure is one line naming the object and the client; a client
that is not installed, unknown, or one a loader cannot take, is refused in one line."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

from facebench import loaders
from facebench.config import StorageConfig
from facebench.config.choices import S3Client
from facebench.data.listing import list_bucket_usable
from facebench.errors import ConfigError, StorageError
from facebench.host.extras import Requirement
from facebench.host.paths import cache_dir
from facebench.run.runner import run_training
from facebench.storage import client, clients, objects, server
from facebench.storage.address import parse
from facebench.storage.credentials import credentials_source
from facebench.storage.distance import counters, emulated, snapshot
from facebench.storage.sync import upload_tree
from tests.helpers import assert_same_samples, delivered, expected

pytest.importorskip("swift", reason="the local object server needs pip install -e '.[s3server]'")

NAMES = [name.value for name in S3Client]
INSTALLED = [
    name if clients.module(name).REQUIREMENT.available()
    else pytest.param(name, marks=pytest.mark.skip(reason=f"storage.client={name}: not installed"))
    for name in NAMES
]  # fmt: skip
PAYLOAD = bytes(range(256)) * 400  # 100 kB, every byte value
KEY = "clients/payload.bin"
URL = f"s3://{server.BUCKET}/{KEY}"


def _through(name: str, endpoint: str, via: str = "") -> client.Endpoint:
    """This process's GETs through client library `name`, at endpoint (or the relay `via`)."""
    pointed = client.Endpoint(endpoint, server.REGION, True, via=via, client=name)
    client.configure(None)  # a client of its own, whatever the last test made
    client.configure(pointed)
    return pointed


@pytest.fixture(autouse=True)
def credentials(s3: server.Running) -> Iterator[None]:
    os.environ.update(s3.environment())
    yield
    client.configure(None)


@pytest.fixture(scope="module")
def servers(s3: server.Running, moto: server.Running) -> dict[str, server.Running]:
    """The bundled server and moto's, each holding PAYLOAD at URL."""
    for running in (s3, moto):
        _through("crt", running.endpoint)
        objects.put_bytes(URL, PAYLOAD, {})
    return {"bundled": s3, "moto": moto}


def _apart(name: str, check, *args) -> None:
    """Run `check(name, *args)` here, or, for a client with a runtime of its own (obstore,
    s3dlio: the workers of a later test, forked from this process, would refuse it; s3dlio
    keeps its first endpoint and keys for the whole process), in a fresh process of its own
    (its errors raised here)."""
    if getattr(clients.module(name), "FORK_SAFE", True):
        check(name, *args)
        return
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(check, name, *args).result()


def _reads_the_same_bytes(name: str, endpoint: str, which: str) -> None:
    _through(name, endpoint)
    whole = client.get(URL)
    assert whole.data == PAYLOAD
    assert 0 < whole.first_byte_ns <= whole.latency_ns
    assert client.get(URL, (1000, 5000)).data == PAYLOAD[1000:5000]
    assert [reply.data for reply in client.get_ranges(URL, [(0, 10), (99_990, 102_400)])] == [
        PAYLOAD[:10],
        PAYLOAD[99_990:],
    ]
    with pytest.raises(StorageError, match=rf"{URL}x: no such object .*storage.client={name}"):
        client.get(f"{URL}x")
    missing = f"s3://nobucket-{which}/{KEY}"
    with pytest.raises(StorageError, match=rf"s3://nobucket-{which}: no such bucket.*{name}"):
        client.get(missing)


@pytest.mark.parametrize("name", INSTALLED)
@pytest.mark.parametrize("which", ["bundled", "moto"])
def test_every_client_reads_the_same_bytes(name: str, which: str, servers) -> None:
    _apart(name, _reads_the_same_bytes, servers[which].endpoint, which)


def _reads_the_copy(name: str, endpoint: str, folder: Path) -> None:
    storage = StorageConfig(
        name="custom", url=f"s3://{server.BUCKET}/clients", endpoint=endpoint,
        region=server.REGION, path_style=True, latency_ms=1, client=name,
    )  # fmt: skip
    with emulated(storage, folder) as via:
        _through(name, endpoint, via)
        before = snapshot(via)
        replies = client.get_many([URL] * 12)
        ranged = client.get(URL, (5, 70_000))
        seen = counters(via, before)
    assert all(reply.data == PAYLOAD for reply in replies)
    assert ranged.data == PAYLOAD[5:70_000]
    assert seen["storage_relay_requests"] == 13  # every GET through the relay, from its copy
    assert seen["storage_relay_endpoint_frac"] == 0


@pytest.mark.parametrize("name", INSTALLED)
def test_every_client_reads_the_emulated_bucket_as_the_server(name, servers, tmp_path) -> None:
    _apart(name, _reads_the_copy, servers["bundled"].endpoint, tmp_path)


def _refused(name: str, endpoint: str) -> None:
    os.environ["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    _through(name, endpoint)
    with pytest.raises(StorageError, match=rf"refused the credentials for {URL} .*{name}"):
        client.get(URL)


@pytest.mark.parametrize("name", INSTALLED)
def test_wrong_credentials_end_in_one_line_naming_the_client(name, servers, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.SECRET_KEY)  # restored after the test
    _apart(name, _refused, servers["bundled"].endpoint)  # Swift checks signatures; moto does not


@pytest.fixture(scope="module")
def uploaded(s3: server.Running, synthetic_root: Path) -> str:
    _through("crt", s3.endpoint)
    upload_tree(synthetic_root, parse("s3://facebench/clients120"))
    return "s3://facebench/clients120"


@pytest.mark.parametrize(
    "name", [name if name == "boto3" else pytest.param(name, marks=pytest.mark.slow)
             for name in INSTALLED]
)  # fmt: skip
def test_a_loader_reads_every_sample_once_through_each_client(
    name, s3: server.Running, uploaded: str, synthetic_root: Path, make_cfg
) -> None:
    cfg = make_cfg(
        "loader=dataset", "n_workers=2", "loader.crop=center", *s3.overrides(uploaded),
        "storage.emulate=false", f"storage.client={name}",
    )  # fmt: skip
    client.configure(None)
    client.configure(client.Endpoint.of(cfg.storage))
    listing = list_bucket_usable(parse(uploaded), "raise", cache_dir(cfg.data.cache_dir))
    spec = loaders.get("dataset")
    ctx = loaders.context(cfg, spec, listing, torch.device("cpu"), None)
    seen = delivered(spec.build(ctx))
    assert sorted(seen) == list(range(len(listing.records)))
    assert_same_samples(seen, expected(synthetic_root))


def test_a_client_not_installed_is_refused_in_one_line(monkeypatch) -> None:
    missing = Requirement("no_such_package_here", "s3clients")
    monkeypatch.setattr(clients.module("fsspec"), "REQUIREMENT", missing)
    with pytest.raises(
        ConfigError,
        match=r"storage.client=fsspec needs no_such_package_here, which is not installed: "
        r"pip install -e '.\[s3clients\]'",
    ):
        credentials_source("", "fsspec")


def test_a_loader_with_its_own_client_refuses_another(s3, uploaded, make_cfg, tmp_path) -> None:
    cfg = make_cfg(
        "loader=s3connector", *s3.overrides(uploaded), "storage.emulate=false",
        "storage.client=boto3",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"loader=s3connector with storage.client=boto3: its"):
        run_training(cfg, output_dir=tmp_path)


def test_an_unknown_client_is_refused_as_the_config_is_composed(make_cfg) -> None:
    with pytest.raises(Exception, match=r"storage.client.*nope"):
        make_cfg("storage.client=nope")


def test_a_worker_forked_after_its_parent_used_a_runtime_refuses_it(monkeypatch) -> None:
    """obstore's and s3dlio's runtimes do not survive a fork: a worker forked from a process
    that used one says so in one line, where its first request would wait forever."""
    monkeypatch.setattr(clients, "_used", {"obstore"})
    monkeypatch.setattr(clients, "_inherited", set())
    clients._forked()  # as os.register_at_fork calls it in the child
    endpoint = client.Endpoint("http://127.0.0.1:9", server.REGION, True, client="obstore")
    with pytest.raises(StorageError, match=r"storage.client=obstore: this worker was forked"):
        clients.make("obstore", endpoint)
    assert clients._used == set()
    clients.make("crt", endpoint)  # a library with no runtime of its own is made as ever


def test_a_failure_is_read_from_its_status_not_any_number_in_a_dump() -> None:
    """obstore's messages carry a debug dump (request ids, elapsed times) that may hold "503"
    anywhere: only a 503 status is a SlowDown."""
    dump = "<Code>SignatureDoesNotMatch</Code> RequestId: tx9c503e elapsed: 3.503ms status: 403"
    assert client._kind(dump) == "refused"
    assert client._kind("Client error with status: 503, body: None") == "throttled"
    assert client._kind("An error occurred (503) when calling the GetObject operation") == (
        "throttled"
    )
    assert client._kind("service error: SlowDown (Please reduce your request rate.)") == (
        "throttled"
    )
