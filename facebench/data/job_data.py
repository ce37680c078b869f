"""A job's data: found (or generated), listed and checked once, before any clock starts."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from facebench.config import TrainConfig
from facebench.data.images import set_max_pixels
from facebench.data.listing import Listing, list_bucket_usable, list_usable
from facebench.data.location import data_layout, data_root
from facebench.errors import ConfigError
from facebench.host.distributed import World, barrier
from facebench.host.paths import cache_dir
from facebench.storage import client, distance
from facebench.storage.address import parse
from facebench.storage.credentials import credentials_source


@dataclass(frozen=True)
class JobData:
    listing: Listing
    listing_s: float  # listing and checking every file
    # Where the data came from, for the run's tags: the endpoint, bucket and prefix, and where
    # the credentials were found (never what they are). Empty for local data.
    storage_tags: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return len(self.listing.usable.skipped)

    def metrics(self) -> dict[str, float]:
        return {"samples_skipped": float(self.skipped), "listing_s": self.listing_s}


def list_data(cfg: TrainConfig, world: World, via: str = "") -> JobData:
    """Generate (synthetic) or find the data, list every sample, check the files are usable.
    `via`: the relay that emulates a bucket's distance, where the job runs one."""
    set_max_pixels(cfg.data.max_pixels)  # before any worker is forked: they inherit it
    if not world.is_main:  # rank 0 generates (or checks) the data; the others wait and reuse it
        barrier(world)
    n_procs = max(cfg.n_workers, 1)
    if cfg.storage.name == "s3":
        data = _list_bucket(cfg, n_procs, via)
    else:
        client.configure(None)
        root = data_root(cfg.data, n_procs=n_procs)
        started = time.perf_counter()
        listing = list_usable(
            root, cfg.on_bad_sample, cache_dir(cfg.data.cache_dir), n_procs, data_layout(cfg.data)
        )
        data = JobData(listing, time.perf_counter() - started)
    root = data.listing.root
    n_usable = len(data.listing.usable.records)
    if n_usable < cfg.batch_size:
        raise ConfigError(
            f"batch_size={cfg.batch_size} is larger than the {n_usable} usable samples "
            f"in {root}; with drop_last no batch would be delivered. Use a smaller batch_size "
            "(or more data: data.n_images for the synthetic set)"
        )
    return data


def _list_bucket(cfg: TrainConfig, n_procs: int, via: str) -> JobData:
    """The data under storage.url, listed and checked; the endpoint set for this process and
    the workers it forks."""
    endpoint = client.Endpoint.of(cfg.storage, via)
    source = credentials_source(
        endpoint.profile, endpoint.client
    )  # no credentials: refused before any request
    client.configure(endpoint)
    address = parse(cfg.storage.url)
    started = time.perf_counter()
    listing = list_bucket_usable(
        address, cfg.on_bad_sample, cache_dir(cfg.data.cache_dir), n_procs, data_layout(cfg.data)
    )
    tags = {
        "storage_endpoint": endpoint.host,
        "storage_bucket": address.bucket,
        "storage_prefix": address.key,
        "storage_credentials_from": source,
        "storage_client": endpoint.client,
    }
    if via:
        tags["storage_distance"] = distance.describe(cfg.storage)
    return JobData(listing, time.perf_counter() - started, tags)
