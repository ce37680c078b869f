"""Data in a bucket, against a real S3-compatible server (Swift with s3api, started here): the
upload's resume and ownership rules, the same samples, labels and pixels as from the local
folder for every loader that reads a bucket, the request metrics, and each fault in one line."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from PIL import Image

from facebench import loaders, stages
from facebench.config import StorageConfig
from facebench.data.listing import list_bucket_usable, list_usable
from facebench.data.location import data_layout
from facebench.errors import ConfigError, DataError, ShardError, StorageError
from facebench.fetches import (
    FETCH_METRICS,
    Fetches,
    bucket,
    bucket_top_ms,
    percentile_ms,
    requests_in_flight,
)
from facebench.host.children import alive
from facebench.host.distributed import whole_job
from facebench.host.paths import PROJECT_ROOT, cache_dir
from facebench.host.ports import free_port
from facebench.run.runner import run_training
from facebench.shards.manifest import Manifest
from facebench.storage import client, objects, server
from facebench.storage.address import Address, parse, path_style
from facebench.storage.bounds import Bounds
from facebench.storage.distance import Distance, counters, emulated, snapshot
from facebench.storage.sync import MANIFEST, upload_tree
from tests.helpers import (
    CLOSE,
    FAST_LOADERS,
    TOLERANCE,
    assert_same_samples,
    delivered,
    expected,
)

pytest.importorskip("swift", reason="the local object server needs pip install -e '.[s3server]'")

# The loaders that read each image from a bucket; the fast subset runs the article's.
BUCKET_LOADERS = [
    name if name in FAST_LOADERS else pytest.param(name, marks=pytest.mark.slow)
    for name in loaders.names(real_only=True, storage="s3")
    if loaders.get(name).format_for() is None
]
# Each with worker processes (or threads); the fast subset's also in the loop (n_workers=0), where
# their GETs are made by the loop's own pool. The others' loop cases add little and cost time.
BUCKET_CASES = [
    case
    for name in BUCKET_LOADERS
    for case in (
        [(name, 0), (name, 2)]
        if isinstance(name, str)
        else [pytest.param(name.values[0], 2, marks=pytest.mark.slow)]
    )
]
# Those that read shards uploaded by prepare.py storage=s3: (loader, its options, the format).
SHARD_LOADERS = [
    ("pickle", [], "pickle"),
    ("raw", [], "raw"),
    ("webdataset", ["loader.decoder=pil"], "tar"),
    ("s3connector", ["loader.reads=shards"], "tar"),
    pytest.param("litdata", [], "litdata", marks=pytest.mark.slow),
    pytest.param("parquet", ["loader.mode=streaming"], "parquet", marks=pytest.mark.slow),
    pytest.param("lance", [], "lance", marks=pytest.mark.slow),
]


def plain(running: server.Running, url: str = f"s3://{server.BUCKET}/data") -> list[str]:
    """A run's overrides for data under `url` on the server as it answers: these tests read the
    server itself, not an emulated distance (tests/test_distance.py)."""
    return running.overrides(url, emulate=False)


@pytest.fixture(autouse=True)
def endpoint(s3: server.Running) -> Iterator[client.Endpoint]:
    """Each test starts with the client pointed at the module's server."""
    os.environ.update(s3.environment())
    pointed = client.Endpoint(s3.endpoint, server.REGION, True)
    client.configure(pointed)
    yield pointed
    client.configure(None)


@pytest.fixture(scope="module")
def uploaded(s3: server.Running, synthetic_root: Path) -> str:
    """The 120-image synthetic set under s3://facebench/syn120."""
    client.configure(client.Endpoint(s3.endpoint, server.REGION, True))
    upload_tree(synthetic_root, parse("s3://facebench/syn120"))
    return "s3://facebench/syn120"


def listed(url: str) -> dict[str, tuple[int, str]]:
    return {entry.key: (entry.size, entry.etag) for entry in objects.list_objects(parse(url))}


def test_addresses() -> None:
    address = parse("s3://bucket/some/prefix/")
    assert address == Address("bucket", "some/prefix")
    assert address.prefix == "some/prefix/"
    assert str(address.child("CelebA", "x.jpg")) == "s3://bucket/some/prefix/CelebA/x.jpg"
    assert parse("s3://bucket").prefix == ""
    assert str(parse("s3://bucket").child("a")) == "s3://bucket/a"


def test_buckets_are_addressed_as_boto3_would_unless_asked() -> None:
    # An IP address or localhost has no DNS name to put the bucket in: path style.
    for endpoint in ("http://127.0.0.1:8090", "http://[::1]:9000", "http://localhost:9000"):
        assert path_style(endpoint, "set"), endpoint
    # AWS's own endpoint, and other host names: virtual host, where the name can lead a host.
    assert not path_style("", "set")
    assert not path_style("https://s3.eu-west-1.amazonaws.com", "my-bucket")
    assert not path_style("http://minio.internal:9000", "set")
    assert not path_style("http://minio.internal:9000", "my.dotted.set")  # plain http: fine
    assert path_style("https://s3.eu-west-1.amazonaws.com", "my.dotted.set")  # one cert label
    assert path_style("", "Upper_Case") and path_style("", "ab")  # no host name holds them
    # storage.path_style forces either; through the relay (an IP address) always path style.
    assert not path_style("http://127.0.0.1:8090", "set", asked=False)
    assert path_style("", "set", asked=True)
    assert path_style("", "set", asked=False, via="http://127.0.0.1:5000")
    storage = dataclasses.replace(
        StorageConfig(), url="s3://set/data", endpoint="http://10.0.0.5:80"
    )
    assert client.Endpoint.of(storage).path_style


def test_latency_percentiles_within_a_bucket() -> None:
    fetches = Fetches()
    for ms in range(1, 101):  # 1 .. 100 ms, one request each
        fetches.add_get(1000, ms * 1_000_000, ms * 500_000, 0, 0)
    more = Fetches()
    more.add_get(10, 5_000_000_000, 1_000_000, 2, 1)  # one slow request, retried twice
    fetches.add(more)
    metrics = fetches.metrics(epoch_time_s=2.0)
    assert metrics["storage_requests"] == 101
    assert metrics["storage_retries"] == 2 and metrics["storage_throttled"] == 1
    assert metrics["storage_requests_per_s"] == pytest.approx(50.5)
    # A percentile is its bucket's top: within 20% above the true value.
    assert 51 <= metrics["storage_get_p50_ms"] <= 51 * 1.2  # the 51st of 101
    assert 99 <= metrics["storage_get_p99_ms"] <= 100 * 1.2
    assert 25 <= metrics["storage_ttfb_p50_ms"] <= 25 * 1.2
    # The first bytes' mean, exact: half of 1..100 ms, and the slow request's 1 ms.
    assert metrics["storage_ttfb_mean_ms"] == pytest.approx((5050 / 2 + 1) / 101)
    assert percentile_ms([0] * 10, 0.5) is None
    assert bucket_top_ms(bucket(3_000_000)) >= 3.0
    assert Fetches().metrics(1.0) == {}


def test_requests_in_flight_are_the_rate_times_the_mean_latency() -> None:
    fetches = Fetches()
    for ms in (10, 10, 10, 90):  # a skewed spread: p50 10 ms, mean 30 ms
        fetches.add_get(1000, ms * 1_000_000, ms * 1_000_000, 0, 0)
    metrics = fetches.metrics(epoch_time_s=0.1)  # 40 requests/s
    assert metrics["storage_get_mean_ms"] == pytest.approx(30.0)
    assert requests_in_flight(metrics) == pytest.approx(40 * 0.030)  # Little's law: 1.2
    assert requests_in_flight({"images_per_s": 100.0}) is None  # no bucket read


def test_server_keeps_its_data_across_restarts(tmp_path: Path) -> None:
    root = tmp_path / "server"
    first = server.start(root, port=0, detached=False)
    try:
        assert server.running(root) == first
        again = server.start(root, port=0, detached=False)  # already running: the same one
        assert again.pids == first.pids
        client.configure(client.Endpoint(first.endpoint, server.REGION, True))
        objects.put_bytes("s3://facebench/kept", b"still here", {})
    finally:
        assert server.stop(root)
    assert server.running(root) is None
    assert not any(alive(pid) for pid in first.pids.values())
    assert not server.stop(root)  # nothing left to stop
    restarted = server.start(root, port=0, detached=False)  # other ports, the same data
    try:
        client.configure(client.Endpoint(restarted.endpoint, server.REGION, True))
        assert objects.read("s3://facebench/kept") == b"still here"
    finally:
        server.stop(root)


def test_a_port_taken_as_the_server_starts_is_chosen_again(tmp_path: Path, monkeypatch, caplog):
    """Between finding a port free and a daemon binding it, another program may take it: the
    proxy would then send its account requests to a stranger (CreateBucket answered 400, once,
    with the suite running). The server sees who listens and starts again on other ports."""
    stranger = socket.create_server(("127.0.0.1", 0))
    taken = stranger.getsockname()[1]
    first = iter([taken])  # the account daemon's port, the first time only
    found_free = server.free_port
    monkeypatch.setattr(server, "free_port", lambda: next(first, None) or found_free())
    root = tmp_path / "server"
    try:
        with caplog.at_level(logging.INFO, logger="facebench.storage.server"):
            running = server.start(root, port=0, detached=False)
        assert f"port [{taken}] taken by another program while the server started" in caplog.text
        client.configure(client.Endpoint(running.endpoint, server.REGION, True))
        objects.put_bytes("s3://facebench/answered", b"by the server itself", {})
        assert objects.read("s3://facebench/answered") == b"by the server itself"
    finally:
        server.stop(root)
        stranger.close()


def test_bucket_lists_the_same_samples_as_the_folder(
    uploaded: str, synthetic_root: Path, cache: Path
) -> None:
    local = list_usable(synthetic_root, "raise", cache)
    remote = list_bucket_usable(parse(uploaded), "raise", cache)
    assert len(remote.records) == len(local.records) == 120
    assert remote.labels == local.labels
    for here, there in zip(local.records, remote.records, strict=True):
        relative = os.path.relpath(here.path, synthetic_root)
        assert there.path == f"{uploaded}/{relative}"
        assert (there.label, there.source) == (here.label, here.source)


def test_folder_layout_from_a_bucket(
    s3: server.Running, tmp_path: Path, cache: Path, make_cfg
) -> None:
    classes = tmp_path / "classes"
    for name, count in (("b", 2), ("a", 3)):
        (classes / name / "sub").mkdir(parents=True)
        for number in range(count):
            place = classes / name / ("sub" if number == 2 else "") / f"{number}.png"
            Image.new("RGB", (8, 8), (number * 40, 0, 0)).save(place)
    (classes / "notes.txt").write_text("not an image")
    upload_tree(classes, parse("s3://facebench/classes"))
    cfg = make_cfg("data=folder", f"data.root={classes}")
    local = list_usable(classes, "raise", cache, layout=data_layout(cfg.data))
    remote = list_bucket_usable(
        parse("s3://facebench/classes"), "raise", cache, layout=data_layout(cfg.data)
    )
    assert remote.labels.classes == local.labels.classes == ("a", "b")
    assert [os.path.relpath(r.path, classes) for r in local.records] == [
        r.path.removeprefix("s3://facebench/classes/") for r in remote.records
    ]
    assert [r.label for r in remote.records] == [r.label for r in local.records]


@contextmanager
def at_s3_standard(cfg, folder: Path) -> Iterator[Callable]:
    """cfg's storage at S3 Standard's emulated distance (20 ms, p99 100 ms), answered from the
    relay's copy: `epoch(spec, ctx)` reads an epoch through it, timed as a whole, and holds its
    rate to the bounds its own requests allow; its batches and totals."""
    with emulated(cfg.storage, folder) as via:
        client.configure(client.Endpoint.of(cfg.storage, via))

        def epoch(spec, ctx) -> tuple[list, stages.StageTotals]:
            totals, batches = stages.begin_epoch(True), []
            before, started = snapshot(via), time.perf_counter()
            for batch in spec.build(ctx):
                totals.add_batch(batch.stages)
                batches.append(batch)
            elapsed = time.perf_counter() - started
            seen = sum(len(batch.labels) for batch in batches)
            metrics = totals.metrics(seen, elapsed) | counters(via, before)
            bounds = Bounds.of({**metrics, "samples_seen": seen}, Distance.of(cfg.storage))
            assert bounds is not None and not bounds.beyond(seen / elapsed), (
                bounds,
                seen / elapsed,
            )
            # From the copy, but a listing's first pages (datapipe lists in its workers).
            assert metrics["storage_relay_endpoint_frac"] < 0.05, metrics
            return batches, totals

        try:
            yield epoch
        finally:  # the server itself again, as each test starts (the relay ends here)
            client.configure(client.Endpoint.of(cfg.storage))


@pytest.mark.parametrize(("name", "n_workers"), BUCKET_CASES)
def test_loader_reads_the_bucket_exactly_once(
    name: str,
    n_workers: int,
    s3: server.Running,
    uploaded: str,
    synthetic_root: Path,
    make_cfg,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """Every sample once, its pixels and label, one GET each, through S3 Standard's distance,
    at a rate its requests could have fed."""
    if name == "raydata":  # Ray's tasks take the environment Ray started with: the credentials
        request.getfixturevalue("ray_with_this_environment")
    cfg = make_cfg(
        f"loader={name}", f"n_workers={n_workers}", "loader.crop=center", *s3.overrides(uploaded)
    )
    with at_s3_standard(cfg, tmp_path) as epoch:
        listing = list_bucket_usable(parse(uploaded), "raise", cache_dir(cfg.data.cache_dir))
        spec = loaders.get(name)
        ctx = loaders.context(cfg, spec, listing, torch.device("cpu"), None)
        batches, totals = epoch(spec, ctx)
    seen = delivered(batches)
    assert sorted(seen) == list(range(len(listing.records)))  # every sample, once
    assert_same_samples(seen, expected(synthetic_root), atol=TOLERANCE if name in CLOSE else 1e-5)
    # Every image was one GET, counted with the batches, whichever process made it.
    sizes = listed(uploaded)
    assert totals.fetches.requests == len(listing.records)
    assert totals.fetches.bytes == sum(
        sizes[r.path.removeprefix(f"{uploaded}/")][0] for r in listing.records
    )


def _bucket_ctx(make_cfg, s3: server.Running, url: str, name: str, *options: str):
    cfg = make_cfg(
        f"loader={name}", *options, "n_workers=2", "batch_size=8", "loader.crop=center",
        *plain(s3, url),
    )  # fmt: skip
    client.configure(client.Endpoint.of(cfg.storage))
    listing = list_bucket_usable(parse(url), "raise", cache_dir(cfg.data.cache_dir))
    spec = loaders.get(name)
    return spec, loaders.context(cfg, spec, listing, torch.device("cpu"), None)


def _bucket_cfg(make_cfg, s3: server.Running, url: str, name: str, *options: str):
    return make_cfg(
        f"loader={name}", *options, "n_workers=2", "batch_size=8", "loader.crop=center",
        *s3.overrides(url),
    )  # fmt: skip


@pytest.mark.parametrize(("name", "options", "shard_format"), SHARD_LOADERS)
def test_shard_loader_reads_the_shards_uploaded_beside_the_data(
    name: str,
    options: list[str],
    shard_format: str,
    s3: server.Running,
    uploaded: str,
    synthetic_root: Path,
    make_cfg,
    prepare_here,
    tmp_path: Path,
) -> None:
    prepare_here(*plain(s3, uploaded), f"format={shard_format}", "batch_size=8")
    shards = f"{uploaded}/facebench-shards/{shard_format}"
    manifest = Manifest.read(shards)
    assert manifest is not None and MANIFEST in listed(shards)  # the set's, and the upload's
    cfg = _bucket_cfg(make_cfg, s3, uploaded, name, *options)
    with at_s3_standard(cfg, tmp_path) as epoch:  # through S3 Standard's distance
        listing = list_bucket_usable(parse(uploaded), "raise", cache_dir(cfg.data.cache_dir))
        spec = loaders.get(name)
        ctx = loaders.context(cfg, spec, listing, torch.device("cpu"), None)
        assert ctx.shards_dir == shards
        assert spec.set_up_job(ctx)["n_shards"] == len(manifest.shards)  # checked, not built
        batches, totals = epoch(spec, ctx)
    seen = delivered(batches)  # fails on a repeated sample
    # 15 shards of 8 samples, a batch each; LitData deals its chunks and may drop a remainder
    # per worker.
    assert len(seen) == 120 if shard_format != "litdata" else len(seen) >= 120 - 2 * 7
    assert_same_samples(seen, expected(synthetic_root))
    # Every shard one GET, counted with the batches in whichever worker made it; the tars'
    # indexes too (their labels are checked against them); not LitData's index.json, read
    # once before the epoch. raw: a range GET per sample.
    sizes = listed(shards)
    fetches = totals.fetches.requests if totals.fetches is not None else 0
    if shard_format == "parquet":  # a file's footer, then its row groups: ranged GETs
        assert len(manifest.shards) <= fetches <= 3 * len(manifest.shards)
        return
    if shard_format == "lance":  # a take's reads of its rows' pages, each a ranged GET
        assert len(batches) <= fetches and totals.fetches.bytes > 0
        return
    if shard_format == "raw":
        assert totals.fetches.requests == len(seen)
        assert totals.fetches.bytes == len(seen) * 112 * 112 * 3
        return
    read = [s.name for s in manifest.shards if s.samples]
    read += [s.index_name for s in manifest.shards if s.index_sha256 and shard_format == "tar"]
    if shard_format == "litdata":  # two workers may both fetch a chunk that neither has yet
        assert len(read) <= totals.fetches.requests <= 2 * len(read)
        assert totals.fetches.bytes >= sum(sizes[name][0] for name in read)
        return
    assert totals.fetches.requests == len(read)
    assert totals.fetches.bytes == sum(sizes[name][0] for name in read)


@pytest.mark.slow
def test_parquet_map_mode_copies_the_bucket_before_the_clock(
    s3: server.Running, uploaded: str, synthetic_root: Path, make_cfg, prepare_here, tmp_path
) -> None:
    """datasets' map-style Dataset reads its Arrow copy: made from the bucket in set-up (each
    file one GET, counted there), then the epoch reads no object."""
    prepare_here(*plain(s3, uploaded), "format=parquet", "batch_size=8")
    manifest = Manifest.read(f"{uploaded}/facebench-shards/parquet")
    # A cache of its own: the copy is made here, not found from another test's.
    spec, ctx = _bucket_ctx(make_cfg, s3, uploaded, "parquet", f"data.cache_dir={tmp_path}")
    metrics = spec.set_up_job(ctx)
    # Each file downloaded whole (its columns are given: datasets reads no schema first).
    assert metrics["parquet_copy_gets"] == len(manifest.shards)
    assert metrics["parquet_copy_mb"] * 1e6 == sum(s.bytes for s in manifest.shards)
    totals, batches = stages.begin_epoch(True), list(spec.build(ctx))
    for batch in batches:
        totals.add_batch(batch.stages)
    assert totals.fetches is None or totals.fetches.requests == 0
    assert_same_samples(delivered(batches), expected(synthetic_root))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["map", "streaming"])
def test_a_parquet_object_replaced_is_read_as_it_is_never_from_an_old_copy(
    s3: server.Running, synthetic_root: Path, make_cfg, prepare_here, tmp_path, mode, monkeypatch
) -> None:
    """A shard of the set in the bucket uploaded again with other images (its manifest made to
    agree): the next run reads the object as it is now, not the Arrow copy made before."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    from facebench.loaders import parquet

    url = f"s3://facebench/parquet-{mode}"  # its own: the module's set stays as uploaded
    upload_tree(synthetic_root, parse(url))
    prepare_here(*plain(s3, url), "format=parquet", "batch_size=8")
    folder = f"{url}/facebench-shards/parquet"
    made = functools.partial(
        _bucket_ctx, make_cfg, s3, url, "parquet", f"loader.mode={mode}",
        f"data.cache_dir={tmp_path}",
    )  # fmt: skip
    spec, ctx = made()
    spec.set_up_job(ctx)
    before = delivered(spec.build(ctx))
    manifest = Manifest.read(folder)
    shard = manifest.shards[0]
    table = pq.read_table(io.BytesIO(objects.read(f"{folder}/{shard.name}")))
    sources = table.column("source").to_pylist()
    one, two = 0, sources.index(sources[0], 1)  # alike: cropped the same way
    images = table.column("image").to_pylist()
    images[one], images[two] = images[two], images[one]
    table = table.set_column(4, "image", pa.array(images, pa.binary()))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=100)
    data = sink.getvalue().to_pybytes()
    objects.put_bytes(f"{folder}/{shard.name}", data, {})
    manifest.shards[0] = dataclasses.replace(
        shard, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    objects.put_bytes(f"{folder}/manifest.json", manifest.encoded(), {})
    monkeypatch.setattr(parquet, "_copies", {})  # as a new process finds it
    spec, ctx = made()
    spec.set_up_job(ctx)
    after = delivered(spec.build(ctx))
    first, second = (table.column("id")[row].as_py() for row in (one, two))
    assert torch.equal(after[first][0], before[second][0])
    assert torch.equal(after[second][0], before[first][0])


def test_a_shard_set_in_a_bucket_is_trusted_only_whole_and_current(
    s3: server.Running, synthetic_root: Path, make_cfg, prepare_here
) -> None:
    url = "s3://facebench/shardfaults"
    upload_tree(synthetic_root, parse(url))
    spec, ctx = _bucket_ctx(make_cfg, s3, url, "pickle")
    with pytest.raises(ShardError, match=rf"{url}/facebench-shards/pickle: no shard set there"):
        spec.set_up_job(ctx)
    prepare_here(*plain(s3, url), "format=pickle", "batch_size=8")
    spec.set_up_job(ctx)
    # An object the set was made from, replaced: the set no longer vouches for the data.
    image = sorted(key for key in listed(url) if key.endswith(".png"))[0]
    objects.put_bytes(f"{url}/{image}", b"other bytes", {"facebench": "1"})
    spec, ctx = _bucket_ctx(make_cfg, s3, url, "pickle")
    with pytest.raises(ShardError, match=r"made from other objects .* Upload it again: python"):
        spec.set_up_job(ctx)
    prepare_here(*plain(s3, url), "format=pickle", "batch_size=8")  # restores both
    spec, ctx = _bucket_ctx(make_cfg, s3, url, "pickle")
    spec.set_up_job(ctx)
    # A shard_size prepare.py cut smaller (for up to 16 workers: 120 images, 3 shards of 40
    # would leave most without one) still serves a run of 2 workers, who get a shard each.
    prepare_here(*plain(s3, url), "format=pickle", "batch_size=8", "shard_size=40")
    spec, sized = _bucket_ctx(make_cfg, s3, url, "pickle", "shard_size=40")
    assert spec.set_up_job(sized)["shard_size_used"] == 8
    # Other settings (another seed shuffles the samples into other shards) name what differs.
    _, other = _bucket_ctx(make_cfg, s3, url, "pickle", "seed=1")
    with pytest.raises(ShardError, match=r"built with other settings: seed 0 \(this run: 1\)"):
        spec.set_up_job(other)
    # A shard gone before the run: refused; gone during the epoch: named.
    first = Manifest.read(ctx.shards_dir).shards[0]
    objects.delete(f"{ctx.shards_dir}/{first.name}")
    with pytest.raises(ShardError, match=rf"{first.name}: missing or not the size"):
        spec.set_up_job(ctx)
    prepare_here(*plain(s3, url), "format=pickle", "batch_size=8")  # uploads just that one
    epoch = spec.build(dataclasses.replace(ctx, n_workers=0))  # the set checked, then:
    objects.delete(f"{ctx.shards_dir}/{first.name}")
    with pytest.raises(ShardError, match=rf"pickle/{first.name}: no such object, though"):
        for _ in epoch:
            pass


def test_an_upload_cut_short_leaves_no_manifest_behind(
    s3: server.Running, synthetic_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = parse("s3://facebench/cut")
    upload_tree(synthetic_root, target, last={"manifest.json": b"{}"})
    assert {MANIFEST, "manifest.json"} <= set(listed(str(target)))
    gone = sorted(key for key in listed(str(target)) if key.endswith(".png"))[:2]
    for key in gone:
        objects.delete(str(target.child(key)))
    sent = []

    def failing(url: str, path: str, metadata: dict[str, str]) -> None:
        sent.append(url)
        raise StorageError("the connection dropped")

    monkeypatch.setattr(objects, "put_file", failing)
    with pytest.raises(StorageError, match="the connection dropped"):
        upload_tree(synthetic_root, target, last={"manifest.json": b"{}"})
    assert sent  # it was sending when it failed, and by then neither manifest vouched for it
    assert not {MANIFEST, "manifest.json"} & set(listed(str(target)))
    monkeypatch.undo()
    resumed = upload_tree(synthetic_root, target, last={"manifest.json": b"{}"})
    assert resumed.sent == 2 and {MANIFEST, "manifest.json"} <= set(listed(str(target)))


@pytest.mark.slow
def test_a_loader_that_makes_its_own_client_is_tagged_with_it(
    s3: server.Running, uploaded: str, make_cfg, prepare_here, tmp_path: Path
) -> None:
    pytest.importorskip("lance")
    prepare_here(*plain(s3, uploaded), "format=lance", "batch_size=8")
    run_training(make_cfg("loader=lance", *plain(s3, uploaded)), output_dir=tmp_path)
    recorded = json.loads((tmp_path / "results.json").read_text())
    assert recorded["tags"]["storage_client"] == "object_store (Rust)"  # not storage.client's
    assert recorded["epochs"][0]["storage_requests"] > 0  # Lance's reads, counted


def test_run_records_requests_and_where_the_data_came_from(
    s3: server.Running, uploaded: str, make_cfg, tmp_path: Path
) -> None:
    cfg = make_cfg("loader=dataset", "n_workers=2", "batch_size=20", *plain(s3, uploaded))
    run_training(cfg, output_dir=tmp_path)
    results = (tmp_path / "results.json").read_text()
    recorded = json.loads(results)
    epoch = recorded["epochs"][0]
    assert epoch["storage_requests"] == 120
    assert epoch["storage_get_p50_ms"] > 0 and epoch["storage_mb_per_s"] > 0
    tags = recorded["tags"]
    assert tags["storage_endpoint"] == s3.endpoint.removeprefix("http://")
    assert (tags["storage_bucket"], tags["storage_prefix"]) == ("facebench", "syn120")
    assert tags["storage_credentials_from"] == "env"
    assert server.SECRET_KEY not in results  # never the credentials


def test_upload_sends_only_what_is_missing(s3: server.Running, synthetic_root: Path) -> None:
    target = parse("s3://facebench/resume")
    first = upload_tree(synthetic_root, target)
    assert first.sent == first.files and MANIFEST in listed(str(target))
    again = upload_tree(synthetic_root, target)
    assert again.sent == 0  # everything is there: nothing sent
    gone = sorted(listed(str(target)))[:3]
    for key in gone:
        objects.delete(str(target.child(key)))
    resumed = upload_tree(synthetic_root, target)
    assert resumed.sent == 3 and set(gone) <= set(listed(str(target)))


def test_upload_never_overwrites_what_facebench_did_not_write(
    s3: server.Running, synthetic_root: Path
) -> None:
    target = parse("s3://facebench/theirs")
    label_key = "CelebA/identity_CelebA.txt"
    client.make("boto").put_object(
        Bucket="facebench", Key=f"theirs/{label_key}", Body=b"someone else's"
    )
    with pytest.raises(
        StorageError, match=r"theirs/CelebA/identity_CelebA.txt: an object facebench did not write"
    ):
        upload_tree(synthetic_root, target)
    assert set(listed(str(target))) == {label_key}  # nothing was written
    assert objects.read(str(target.child(label_key))) == b"someone else's"


@pytest.mark.slow
def test_upload_killed_then_restarted(s3: server.Running, tmp_path: Path, cache: Path) -> None:
    url = "s3://facebench/killed"
    data = [f"data.cache_dir={cache}", "data.n_images=600"]
    command = [sys.executable, "prepare.py", *plain(s3, url), *data, f"hydra.run.dir={tmp_path}"]
    env = {**os.environ, **s3.environment()}
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while len(listed(url)) < 50 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    cut = listed(url)
    assert 50 <= len(cut) < 601, "the upload was not cut short"
    assert MANIFEST not in cut  # nothing vouches for the objects not sent
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    complete = listed(url)
    data = [key for key in complete if not key.startswith("facebench-shards/")]
    assert MANIFEST in complete and len(data) == 601 + 1
    # Then the shards (format=pickle, the default), their set's manifest last.
    assert "facebench-shards/pickle/manifest.json" in complete


def test_refusals_before_any_run(
    s3: server.Running, uploaded: str, make_cfg, tmp_path: Path
) -> None:
    with pytest.raises(DataError, match=r"s3://facebench/nothing: no objects under this prefix"):
        run_training(make_cfg(*plain(s3, "s3://facebench/nothing")), output_dir=tmp_path)
    with pytest.raises(StorageError, match=r"s3://nobucket: no such bucket at 127.0.0.1:\d+"):
        run_training(make_cfg(*plain(s3, "s3://nobucket/x")), output_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"loader=ceiling with storage=s3: it reads no data"):
        run_training(
            make_cfg("loader=ceiling", "model=resnet18", *plain(s3, uploaded)),
            output_dir=tmp_path,
        )
    os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong"
    client._clients.clear()
    try:
        with pytest.raises(
            StorageError, match=r"refused the credentials .*Check AWS_ACCESS_KEY_ID"
        ):
            run_training(make_cfg(*plain(s3, uploaded)), output_dir=tmp_path)
    finally:
        os.environ.update(s3.environment())
        client._clients.clear()
    with pytest.raises(ConfigError, match=r"storage.url=s3://Bad_Bucket: give the data's place"):
        make_cfg("storage=s3", "storage.url=s3://Bad_Bucket")


def test_an_endpoint_that_does_not_answer_costs_a_bounded_wait(
    s3: server.Running, uploaded: str, make_cfg, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = make_cfg(*plain(s3, uploaded), f"storage.endpoint={dead}")
    started = time.monotonic()
    with pytest.raises(
        StorageError, match=r"did not answer for s3://facebench/syn120 after 3 attempts"
    ):
        run_training(cfg, output_dir=tmp_path)
    assert time.monotonic() - started < 30


def test_an_object_gone_after_the_listing_is_named(
    s3: server.Running, synthetic_root: Path, make_cfg, tmp_path: Path
) -> None:
    url = "s3://facebench/vanishing"
    upload_tree(synthetic_root, parse(url))
    cfg = make_cfg(*plain(s3, url), "n_workers=2")
    client.configure(client.Endpoint.of(cfg.storage))
    listing = list_bucket_usable(parse(url), "raise", cache_dir(cfg.data.cache_dir))
    victim = listing.records[77].path
    objects.delete(victim)  # after the listing, before the epoch: as if deleted mid-epoch
    spec = loaders.get("dataset")
    ctx = loaders.context(cfg, spec, listing, torch.device("cpu"), None)
    with pytest.raises(StorageError, match=rf"{victim}: no such object"):
        for _ in spec.build(ctx):
            pass


class _Throttling:
    """A client whose first answers are 503 SlowDown (for the retry path's unit test only)."""

    def __init__(self, refusals: int, data: bytes) -> None:
        self.refusals, self.data = refusals, data

    def get_object(self, bucket: str, key: str):
        from s3torchconnectorclient import S3Exception

        if self.refusals > 0:
            self.refusals -= 1
            raise S3Exception("Service error: Please reduce your request rate.")
        import io

        return io.BytesIO(self.data)


def test_503s_are_retried_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "_BACKOFF_S", 0.001)
    monkeypatch.setattr(client, "make", lambda kind: _Throttling(2, b"image"))
    reply = client.get("s3://facebench/a.png")
    assert (reply.data, reply.retries, reply.throttled) == (b"image", 2, 2)
    monkeypatch.setattr(client, "make", lambda kind: _Throttling(3, b"image"))
    with pytest.raises(
        StorageError, match=r"s3://facebench/a.png: .* answered 503 SlowDown to all 3 attempts"
    ):
        client.get("s3://facebench/a.png")


def test_labels_in_a_bucket_are_checked_as_a_local_file(
    s3: server.Running, tree_factory, cache: Path
) -> None:
    root = tree_factory(
        celeba={"000001.jpg": 1}, digiface={0: 1}, label_text="000001.jpg 1\n000001.jpg 2\n"
    )
    upload_tree(root, parse("s3://facebench/badlabels"))
    with pytest.raises(
        DataError,
        match=r"s3://facebench/badlabels/CelebA/identity_CelebA.txt:2: 000001.jpg is listed again",
    ):
        list_bucket_usable(parse("s3://facebench/badlabels"), "raise", cache)


def test_ranks_storage_metrics_merge_as_one_pool_of_requests() -> None:
    common = {"samples_seen": 60.0, "compute_s": 0.1, "time_to_first_batch_s": 0.1}
    common |= {"data_wait_s": 0.5, "data_wait_frac": 0.5}
    # Rank 0's 60 GETs are quick (2-61 ms), rank 1's 60 slow (200-790 ms): the job's p50 lies
    # between the two, which neither rank's own p50 (nor the larger of them) is.
    samples = [[2 + i for i in range(60)], [200 + 10 * i for i in range(60)]]
    fetched = []
    for rank, latencies in enumerate(samples):
        part = Fetches()
        for ms in latencies:
            part.add_get(1000 * (rank + 1), ms * 1_000_000, ms * 500_000, rank, 0)
        fetched.append(part)
    ranks = [
        {**common, "epoch_time_s": 1.0, **fetched[0].metrics(1.0)},
        {**common, "epoch_time_s": 2.0, **fetched[1].metrics(2.0)},
    ]
    merged = whole_job(ranks, fetched)
    assert merged["storage_requests"] == 120 and merged["storage_retries"] == 60
    assert merged["storage_requests_per_s"] == pytest.approx(60.0)  # over the slowest rank's 2 s
    assert merged["storage_mb_per_s"] == pytest.approx(180_000 / 1e6 / 2)
    pooled = sorted(samples[0] + samples[1])
    assert merged["storage_get_mean_ms"] == pytest.approx(statistics.mean(pooled))
    for share in (50, 99):
        true = pooled[math.ceil(share / 100 * len(pooled)) - 1]
        assert true <= merged[f"storage_get_p{share}_ms"] <= true * 1.2, share
    assert merged["storage_get_p50_ms"] < ranks[1]["storage_get_p50_ms"]
    # No rank fetched anything: no storage figures, rather than rank 0's.
    local = [{**rank, "storage_requests": 5.0} for rank in ranks]
    assert not FETCH_METRICS & whole_job(local, [None, None]).keys()


@pytest.mark.slow
@pytest.mark.parametrize("n_workers", [0, 2])
def test_a_chunk_litdata_cannot_fetch_ends_the_run_in_one_line(
    n_workers: int, s3: server.Running, uploaded: str, cache: Path, tmp_path: Path, prepare_here
) -> None:
    prepare_here(*plain(s3, uploaded), "format=litdata", "batch_size=10")
    # Addressed as bucket.host (forced: by IP address it would be by path), the server reads a
    # key's first folder as its bucket: every chunk's GET is answered NoSuchBucket (404).
    overrides = [
        *plain(s3, uploaded), "storage.path_style=false", f"data.cache_dir={cache}",
        "data.n_images=120", "loader=litdata", f"n_workers={n_workers}", "batch_size=10",
        "model=none", "host_only=true", "tracking=false", f"hydra.run.dir={tmp_path}",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "train.py", *overrides],
        cwd=PROJECT_ROOT,
        env={**os.environ, **s3.environment()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert time.monotonic() - started < 60  # not LitData's 120 s wait for a chunk
    assert "Traceback" not in said and "RetryError" not in said, said[-3000:]
    errors = [line for line in said.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, errors
    assert "facebench-shards/litdata/chunk-" in errors[0]
    assert "no such bucket" in errors[0] or "answered 404" in errors[0]
    assert "storage.path_style=true" in errors[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "loader", [["loader=dataset"], ["loader=s3connector", "loader.reads=shards"]]
)
def test_two_ranks_read_the_bucket_exactly_once(
    loader: list[str], s3: server.Running, uploaded: str, cache: Path, tmp_path: Path, prepare_here
) -> None:
    shards = "loader.reads=shards" in loader
    if shards:  # 12 tar shards of 10, one batch each, dealt by the library to ranks and workers
        prepare_here(*plain(s3, uploaded), "format=tar", "batch_size=10")
    overrides = [
        *plain(s3, uploaded), f"data.cache_dir={cache}", "data.n_images=120",
        *loader, "accelerator=h100", "accelerators_per_host=2", "n_workers=1",
        "batch_size=10", "tracking=false", f"hydra.run.dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "train.py", *overrides],
        cwd=PROJECT_ROOT,
        env={**os.environ, **s3.environment()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    epoch = json.loads((tmp_path / "results.json").read_text())["epochs"][0]
    assert epoch["world_size"] == 2
    assert epoch["samples_unique"] == epoch["samples_seen"] == 120
    # Both ranks' GETs: each image once, or each tar and its index once.
    assert epoch["storage_requests"] == (24 if shards else 120)


def test_a_server_stopped_mid_epoch_ends_the_epoch_in_one_line(
    s3: server.Running, synthetic_root: Path, make_cfg, tmp_path: Path
) -> None:
    root = tmp_path / "second"
    second = server.start(root, port=0, detached=False)
    try:
        client.configure(client.Endpoint(second.endpoint, server.REGION, True))
        url = "s3://facebench/stopping"
        upload_tree(synthetic_root, parse(url))
        cfg = make_cfg(*plain(second, url), "n_workers=2", "storage.requests_per_worker=2")
        client.configure(client.Endpoint.of(cfg.storage))
        listing = list_bucket_usable(parse(url), "raise", cache_dir(cfg.data.cache_dir))
        spec = loaders.get("dataset")
        ctx = loaders.context(cfg, spec, listing, torch.device("cpu"), None)
        batches = iter(spec.build(ctx))
        next(batches)
        server.stop(root)
        with pytest.raises(
            StorageError, match=r"did not answer for s3://facebench/stopping/.* after 3"
        ):
            for _ in batches:
                pass
    finally:
        server.stop(root)


def test_bad_objects_are_named_or_skipped_as_bad_files_are(
    s3: server.Running, tree_factory, cache: Path
) -> None:
    celeba = {f"{n:06d}.jpg": n for n in range(1, 5)}
    root = tree_factory(celeba=celeba, digiface={0: 3})
    images = root / "CelebA" / "img_align_celeba"
    (images / "000002.jpg").write_bytes((images / "000002.jpg").read_bytes()[:200])  # truncated
    (images / "000003.jpg").write_bytes(b"")  # empty
    url = "s3://facebench/bad"
    upload_tree(root, parse(url))
    with pytest.raises(DataError, match=rf"{url}/CelebA/img_align_celeba/000003.jpg: empty object"):
        list_bucket_usable(parse(url), "raise", cache)
    listing = list_bucket_usable(parse(url), "skip", cache, n_procs=2)  # decoded in processes
    skipped = dict(listing.usable.skipped)
    assert set(skipped) == {
        f"{url}/CelebA/img_align_celeba/000002.jpg",
        f"{url}/CelebA/img_align_celeba/000003.jpg",
    }
    assert "cannot decode this image" in skipped[f"{url}/CelebA/img_align_celeba/000002.jpg"]
    assert len(listing.usable.records) == len(listing.records) - 2 == 5
