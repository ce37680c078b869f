"""Typed schemas behind every Hydra config group: every key and its default, once.

Each YAML option under conf/ names its schema in its own defaults list, so a typo, a wrong type
or a value outside a key's choices (`n_workers=abc`, `amp=fp8`, `cache=hot`) fails when the config
is composed, before any work. The choices are Enums (config/choices.py). Values that a type
cannot express (`batch_size=0`) are checked by `validate`, and a job's config is made into these
objects by `typed` (both config/checks.py, which reads these schemas: they import nothing of it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from facebench.config.choices import (
    Amp,
    Answers,
    CacheMode,
    Crop,
    DataLayout,
    Model,
    OnBadSample,
    S3Client,
    Sync,
)
from facebench.config.prices import CostConfig

# Samples per Parquet row group: what Hugging Face's datasets writes for image sets
# (datasets.config.PARQUET_ROW_GROUP_SIZE_FOR_IMAGE_DATASETS), so the Hub's sets read alike.
ROW_GROUP_SIZE = 100


@dataclass
class DataConfig:
    name: str = MISSING
    # How data.root is laid out: faces (CelebA/ + DigiFace1M/) or folder (one folder per class).
    # The synthetic stand-in is generated in either.
    layout: DataLayout = DataLayout.faces
    # The data's folder. Empty for the synthetic stand-in, which lives in the cache folder.
    root: str = ""
    # layout=folder: a "path,label" CSV (relative to data.root, or absolute) instead of class
    # folders.
    labels: str = ""
    # Synthetic stand-in only: how many images to generate (22% CelebA-like, 78% DigiFace-like).
    n_images: int = 0
    # Synthetic stand-in only: the generator's seed (the training seed is the top-level `seed`).
    seed: int = 0
    # Where generated data and shards go; empty means <project root>/.cache.
    cache_dir: str = ""
    # The largest image, in pixels, that is decoded (read from its header first): a larger one
    # is a bad sample (on_bad_sample). 0 lifts the limit. Far above any face or photo data
    # set's images (a 24-megapixel camera's are 24,000,000), far below what a few hundred KB of
    # PNG can declare (a decompression bomb).
    max_pixels: int = 50_000_000


@dataclass
class LoaderConfig:
    """Options every loader understands; a loader with more subclasses this in its module."""

    name: str = MISSING
    crop: Crop = Crop.random
    # Batches each DataLoader worker keeps ready; torch's default is 2.
    prefetch_factor: int = 2


@dataclass
class TransformConfig:
    """Preprocessing geometry: Resize((resize, resize)) -> crop x crop -> Normalize(mean, std)."""

    resize: int = 112  # both sides: any image becomes a resize x resize square
    crop: int = 100  # the random (or center) crop's side
    mean: list[float] = dataclasses.field(default_factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = dataclasses.field(default_factory=lambda: [0.229, 0.224, 0.225])


@dataclass
class AcceleratorConfig:
    """An emulated accelerator (conf/accelerator/): its training rate stands in for the model.

    With one chosen, the loop takes each batch as a GPU run's host side hands it over and then,
    in place of the training step, waits the time the accelerator would train on it (MLPerf
    Storage's method). The rate is `images_per_s` (or `step_batch` images per `step_s`) at
    `measured_at` x `measured_at` pixels, scaled to this run's transform.crop by the pixel
    count: rate x (measured_at / crop)^2. measured_at=0: the rate is for this run's crop.
    """

    name: str = "none"
    images_per_s: float = 0.0
    step_s: float = 0.0
    step_batch: int = 0
    measured_at: int = 0
    # The least accelerator utilization that counts as fed (MLPerf Storage's 90% for ResNet-50).
    min_au: float = 0.90
    # Where the figure comes from, and how it was obtained (measured, published, scaled).
    source: str = ""
    # The share of one core the training process keeps busy during a step (launching kernels,
    # the optimizer's Python, CUDA's wait for the step, which spins while the host has more
    # cores than CUDA contexts): spun in the loop's process whenever it waits for a step, so
    # the loader's workers and threads compete with it as on a GPU host. 0: the host idles.
    host_cpu: float = 1.0
    host_cpu_source: str = (
        "unmeasured: CUDA's default scheduling spins the thread that waits for a step, so a "
        "loop that waits for every step keeps about one core busy; a run that waits less "
        "leaves its loader more, and emulation then errs on the pessimistic side"
    )
    # every_step: the loop waits for each step before it asks for the next batch (the article's
    # loop reads the loss each step). none: the step computes while the loop fetches the next
    # batch, at most `queue` steps launched and not finished, as CUDA's launch queue runs ahead
    # until the host waits for a result.
    sync: Sync = Sync.every_step
    queue: int = 2


@dataclass
class DistanceConfig:
    """A bucket's distance: the one list of its limits (storage.latency_ms and the rest, flat
    in StorageConfig, which inherits them). The config's checks, the relay's options and
    facebench/storage/distance.py's Distance all read their names from here, so a new limit is
    a field added here.

    Emulated by a relay train.py and advise run in front of a plain http:// endpoint (a server
    on this machine or network) for every client alike; 0 turns each off. The profiles
    (storage=s3, s3-express) set them from published figures.
    """

    latency_ms: float = 0.0  # before each response's first byte: its median
    # Its 99th percentile: each request's latency is drawn from a log-normal fitted to the two
    # (facebench/storage/latency.py); 0: every request waits latency_ms exactly.
    latency_p99_ms: float = 0.0
    bandwidth_mbps: float = 0.0  # per connection, megabits a second
    total_mbps: float = 0.0  # the host's link, over all connections, megabits a second
    requests_per_s: float = 0.0  # past it, 503 SlowDown


@dataclass
class StorageConfig(DistanceConfig):
    """Where the data are read from (conf/storage/): the local file system, or an S3 bucket,
    at a distance (DistanceConfig's keys: storage.latency_ms and the rest).

    With storage=s3, the data's layout (data=synthetic, celeba_digiface, folder) is found under
    `url` instead of a folder: s3://bucket/prefix/CelebA/..., as `python prepare.py storage=s3`
    uploads it. Credentials come the standard AWS way (AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, AWS_PROFILE or `profile`) and are never logged.
    """

    name: str = "local"
    # s3://bucket/prefix: the data set's layout lives under the prefix.
    url: str = ""
    # The S3 endpoint, http(s)://host:port; empty: AWS's own for the region.
    endpoint: str = ""
    region: str = "us-east-1"
    # true: address buckets as endpoint/bucket/key; false: as bucket.endpoint/key (virtual
    # host); null: as boto3 would, path style for an IP address or localhost endpoint (and a
    # bucket name no host name can hold), virtual host for AWS and other host names. Every
    # client (boto3, the CRT client, LitData's, s3connector) is given the same answer.
    path_style: bool | None = None
    # A profile of ~/.aws/credentials and ~/.aws/config; empty: AWS_PROFILE, or the default.
    profile: str = ""
    # GETs each loader worker (or the loop, with n_workers=0) keeps in flight, from a pool of
    # threads: one image's latency hides behind the others' (pytorch#158218).
    requests_per_worker: int = 8
    # The S3 client library each image's (and each shard's) GET goes through: crt (AWS's CRT
    # client, s3torchconnector's), boto3, obstore, s3dlio, fsspec (s3fs). Loaders whose library
    # makes its own client (s3connector, litdata, raydata) keep theirs. docs/loaders.md.
    client: S3Client = S3Client.crt
    # Attempts per request before a read fails (S3's 503 SlowDown and dropped connections are
    # retried, with backoff).
    attempts: int = 3
    # Emulate the distance (DistanceConfig's keys) where the endpoint is plain http://; false:
    # read the server as it answers. An https:// endpoint or AWS's own is never emulated: its
    # distance is real.
    emulate: bool = True
    # At an emulated distance, who answers: the relay from its copy of each object (fetched
    # once before any epoch, kept in data.cache_dir/bucket-copy/): a real bucket's servers cost
    # the host nothing; or the endpoint itself, through the relay: to measure that server.
    answers: Answers = Answers.copy
    # The relay under real-time scheduling, to answer at its time while the loader fills the
    # cores (where the process may: root, CAP_SYS_NICE, ulimit -r); false: the fair scheduler's.
    realtime: bool = True
    # What the distance stands for, and where its numbers come from (the profile's YAML).
    distance_name: str = ""
    distance_source: str = ""


@dataclass
class CommonConfig:
    """Keys that train.py and prepare.py share, so the same overrides mean the same thing."""

    data: DataConfig = MISSING
    # DataLoader workers in train.py; decoding processes in prepare.py.
    n_workers: int = 5
    seed: int = 0
    # Samples per shard (the article used 10,000): a file of pickle, raw, tar and Parquet
    # shards, a fragment of a Lance set.
    shard_size: int = 10_000
    # format=parquet: samples per row group, the least a read of one sample fetches (a random
    # read costs a row group; a large one compresses better and means fewer requests).
    row_group_size: int = ROW_GROUP_SIZE
    # Samples per batch. prepare.py cuts shards that must be smaller than shard_size (so that
    # every loader worker reads its own) in whole batches of it, as train.py does.
    batch_size: int = 600
    # Where shards are written and read; empty means <data folder>/facebench-shards.
    shards_dir: str = ""
    # A file that is missing, empty or does not decode: raise (stop, naming it) or skip (leave it
    # out of every loader alike, and count it).
    on_bad_sample: OnBadSample = OnBadSample("raise")
    # Resize, crop and normalization; shards that hold resized pixels (raw, litdata) follow it.
    transform: TransformConfig = dataclasses.field(default_factory=TransformConfig)
    # Where the data are: storage=local (data.root, or the cache) or storage=s3 (a bucket).
    storage: StorageConfig = dataclasses.field(default_factory=StorageConfig)
    # What requests, bytes and accelerator-hours cost (conf/cost/): dollars beside each rate.
    cost: CostConfig = dataclasses.field(default_factory=CostConfig)


@dataclass
class TrainConfig(CommonConfig):
    loader: LoaderConfig = MISSING
    model: Model = Model.resnet50
    # Mixed precision of the forward pass.
    amp: Amp = Amp.auto
    epochs: int = 1
    # 0 runs the whole epoch; N stops each epoch after N batches.
    max_batches: int = 0
    # auto | cpu | cuda | cuda:N
    device: str = "auto"
    # Page cache before each epoch: warm (files read in first), cold (evicted), keep (as found).
    cache: CacheMode = CacheMode.warm
    # Measure the whole run (all epochs) this many times in one job.
    repeat: int = 1
    # Resource samples per second (memory, GPU); 0 samples only at the start and end of an epoch.
    sample_hz: float = 4.0
    # Hash every shard against its manifest before the epoch (pickle shards are always hashed
    # before they are unpickled; raw and tar are otherwise checked by size).
    verify_shards: bool = False
    # With model=none: stop where a GPU run hands a batch to the device (uint8 images and crop
    # offsets for the loaders the device finishes), so a CPU-only machine measures a GPU run's
    # host side. No copy to the device, no finishing.
    host_only: bool = False
    # Record the run in MLflow; false runs with no tracking at all.
    tracking: bool = True
    # Time each image's stages (read, decode, transform, collate in the workers; wait,
    # handover, finish, step in the loop): stage_* metrics. false turns the timing off.
    stage_times: bool = True
    # Refuse n_workers whose estimated memory exceeds what is available; false starts them anyway.
    resource_check: bool = True
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    # An emulated accelerator in place of the model (accelerator=a100 | h100 | custom); none:
    # the real device.
    accelerator: AcceleratorConfig = dataclasses.field(default_factory=AcceleratorConfig)
    # Emulated accelerators on this host, one process each (started with torchrun's launcher),
    # each with its own loader and n_workers; the epoch is split between them.
    accelerators_per_host: int = 1


@dataclass
class PrepareConfig(CommonConfig):
    # Shard format to write: pickle (the article's: pickled PIL images), raw (resized uint8
    # records), tar (WebDataset tars of the original files), litdata (LitData chunks of resized
    # uint8 samples; needs pip install -e '.[litdata]'). The formats are in shards/formats.py.
    format: str = "pickle"
    # Processes decoding and writing shards.
    n_workers: int = 2


@dataclass
class AdviseConfig(TrainConfig):
    """python -m facebench.advise: train.py's keys, and how much to measure."""

    # Seconds for the whole answer: the compute ceiling, then every loader.
    budget_s: float = 300.0
    # Larger data sets are measured on a sample of this many images, linked into the cache.
    sample_images: int = 20_000
    # Loaders to measure (empty: every installed one), e.g. loaders=[dataset,raw].
    loaders: list[str] = dataclasses.field(default_factory=list)
    # Worker counts to try (empty: 1, 2, 4, ... up to the cores), e.g. workers=[1,2].
    workers: list[int] = dataclasses.field(default_factory=list)


def register_configs() -> None:
    """Put the schemas where the YAML files' defaults lists can find them."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="prepare_schema", node=PrepareConfig)
    cs.store(name="advise_schema", node=AdviseConfig)
