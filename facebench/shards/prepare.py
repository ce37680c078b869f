"""prepare.py's job: build the shards of the configured data, or say they are up to date."""

from __future__ import annotations

import logging
from pathlib import Path

from facebench.config import PrepareConfig
from facebench.costs import GB, Prices, put_cost
from facebench.data.images import set_max_pixels
from facebench.data.listing import list_bucket_usable
from facebench.data.location import data_layout, data_root
from facebench.errors import Interrupted, interruption
from facebench.host.paths import cache_dir, shards_root
from facebench.results import write_results
from facebench.shards import formats
from facebench.shards.build import ShardSet, ensure_shards
from facebench.shards.in_bucket import bucket_folder, upload_set
from facebench.storage import client
from facebench.storage.address import parse
from facebench.storage.credentials import credentials_source
from facebench.storage.sync import Uploaded, upload_tree

log = logging.getLogger(__name__)


def run_prepare(
    cfg: PrepareConfig,
    output_dir: Path | None = None,
    sweep_id: str | None = None,
    multirun: bool = False,
) -> ShardSet | None:
    """Build the shards for the configured data, or say they are up to date; with storage=s3,
    upload the data set to the bucket, then its shards beside it."""
    shard_format = formats.get(cfg.format)
    if shard_format.requires is not None:
        shard_format.requires.require(f"format={cfg.format}")
    set_max_pixels(cfg.data.max_pixels)  # before any worker is forked: they inherit it
    if cfg.storage.name == "s3":
        return _upload(cfg, output_dir)
    shard_set = _build(cfg, data_root(cfg.data, n_procs=max(cfg.n_workers, 1)))
    if output_dir is not None:
        write_results(
            output_dir / "results.json",
            {
                "shards_dir": str(shard_set.folder),
                "built": shard_set.built,
                "prepare_s": shard_set.seconds,
                "n_shards": len(shard_set.manifest.shards),
                "n_samples": shard_set.manifest.n_samples,
                "samples_skipped": shard_set.skipped,
            },
        )
    return shard_set


def _build(cfg: PrepareConfig, root: Path) -> ShardSet:
    """The shards of the data set at root, built in their local folder (or found there)."""
    shard_format = formats.get(cfg.format)
    n_procs = max(cfg.n_workers, 1)
    folder = shards_root(cfg.shards_dir, root, cfg.format)
    try:
        shard_set = ensure_shards(
            root,
            folder,
            cfg.format,
            cfg.seed,
            cfg.shard_size,
            n_procs,
            on_bad_sample=cfg.on_bad_sample,
            cache=cache_dir(cfg.data.cache_dir),
            layout=data_layout(cfg.data),
            resize=cfg.transform.resize,
            row_group_size=cfg.row_group_size,
            readers=None,  # for whichever worker counts train.py will use (up to 16)
            batch_size=cfg.batch_size,
        )
    except BaseException as error:
        stop = interruption(error)
        if stop is None:
            raise
        outcome = (
            f"nothing was written to {folder} (format={cfg.format} is built whole; the next "
            "prepare.py starts it again)"
            if shard_format.whole_set
            else f"shards finished so far in {folder} are kept; the next prepare.py resumes"
        )
        raise Interrupted.of(stop, outcome) from error
    verb = "built" if shard_set.built else "checked"
    log.info("%s %s in %.1f s", verb, folder, shard_set.seconds)
    return shard_set


def _upload(cfg: PrepareConfig, output_dir: Path | None) -> ShardSet:
    """prepare.py storage=s3: the data set (the synthetic one generated first) uploaded under
    storage.url, in its layout; then its shards, built here, uploaded beside it. Resumable."""
    endpoint = client.Endpoint.of(cfg.storage)
    source = credentials_source(endpoint.profile, endpoint.client)
    client.configure(endpoint)
    address = parse(cfg.storage.url)
    n_procs = max(cfg.n_workers, 1)
    root = data_root(cfg.data, n_procs=n_procs)
    log.info("uploading %s to %s at %s (credentials from %s)", root, address, endpoint.host, source)
    where = str(address)
    try:
        data = upload_tree(root, address)
        _say_uploaded(data, where)
        shard_set = _build(cfg, root)
        # The set's manifest records what it was made from as train.py will list it.
        listing = list_bucket_usable(
            address,
            cfg.on_bad_sample,
            cache_dir(cfg.data.cache_dir),
            n_procs,
            data_layout(cfg.data),
        )
        where = bucket_folder(cfg.storage.url, cfg.format)
        shards = upload_set(shard_set, listing, cfg.storage.url)
        _say_uploaded(shards, where)
    except BaseException as error:
        stop = interruption(error)
        if stop is None:
            raise
        outcome = f"objects sent so far stay in {where}; the next prepare.py storage=s3 resumes"
        raise Interrupted.of(stop, outcome) from error
    if output_dir is not None:
        found = {"storage_url": str(address), "shards_url": where}
        write_results(output_dir / "results.json", found | _uploaded(cfg, data, shards, shard_set))
    return shard_set


def _uploaded(
    cfg: PrepareConfig, data: Uploaded, shards: Uploaded, shard_set: ShardSet
) -> dict[str, object]:
    """What the upload sent and cost, for results.json."""
    cost = _upload_cost(cfg, data, shards)
    return {
        "uploaded_files": data.sent + shards.sent,
        "files": data.files + shards.files,
        "uploaded_bytes": data.bytes_sent + shards.bytes_sent,
        "upload_s": data.seconds + shards.seconds,
        "n_shards": len(shard_set.manifest.shards),
        "n_samples": shard_set.manifest.n_samples,
        "put_requests": data.puts + shards.puts,
        "list_requests": data.lists + shards.lists,
        **({"upload_usd": cost} if cost is not None else {}),
    }


def _upload_cost(cfg: PrepareConfig, data: Uploaded, shards: Uploaded) -> float | None:
    """What the upload cost at the storage profile's prices (None: none known), said once."""
    puts, lists = data.puts + shards.puts, data.lists + shards.lists
    sent = data.bytes_sent + shards.bytes_sent
    cost = put_cost(Prices.of(cfg.cost, cfg.storage.name), puts, lists, sent / GB)
    if cost is not None:
        log.info(
            "the upload cost $%.4f: %d PUTs, %d LISTs, %.1f MB at storage=%s's prices "
            "(conf/cost/)", cost, puts, lists, sent / 1e6, cfg.storage.name,
        )  # fmt: skip
    return cost


def _say_uploaded(done: Uploaded, where: str) -> None:
    if done.sent:
        log.info(
            "uploaded %d of %d files (%.1f MB) to %s in %.1f s",
            done.sent, done.files, done.bytes_sent / 1e6, where, done.seconds,
        )  # fmt: skip
    else:
        log.info("%s is up to date: all %d files are there", where, done.files)
