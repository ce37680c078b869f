"""facebench.advise answers on a tiny synthetic set, and its reasoning holds on made-up numbers."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from facebench.advise import Advice, Measured, advise, shortfall, worker_counts
from facebench.advise.from_bucket import what_it_takes
from facebench.errors import ConfigError
from facebench.fetches import Fetches
from facebench.host.paths import PROJECT_ROOT
from facebench.storage.bounds import Bounds
from facebench.storage.distance import Distance
from facebench.storage.limits import client_cpu_us, held_by, holding_back


def _advice(*measured: Measured, ceiling: float = 1000.0) -> Advice:
    return Advice(
        model="resnet50",
        device="cuda:0",
        ceiling=ceiling,
        n_images=100_000,
        n_sample=10_000,
        measured=list(measured),
        seconds=10.0,
        budget_s=300.0,
        counts=[1, 2, 4],
    )


def test_the_fewest_workers_that_keep_up_win():
    slow = Measured("dataset", rates={1: 300.0, 2: 600.0, 4: 1150.0})
    fast = Measured("raw", rates={1: 5000.0}, prepare_s=12.0, shard_bytes=2_000_000_000)
    advice = _advice(slow, fast)
    assert advice.verdict().startswith("Use loader=raw n_workers=1: it keeps resnet50")
    assert "one epoch of 100,000 images in about 100 s" in advice.verdict()
    assert "dataset (4)" in advice.verdict()
    rows = {row[0]: row for row in advice.rows()}
    # Build time and disk are scaled from the 10,000-image sample to the 100,000 images.
    assert rows["raw"][5] == "120.0 s" and rows["raw"][6] == "20.0 GB"


def test_a_loader_that_falls_short_says_why():
    scales = Measured("dataset", rates={1: 100.0, 2: 200.0, 4: 400.0})
    assert shortfall(scales, ceiling=1000.0, cores=4) == (
        "about 100 images/s per worker: the device needs 10 workers, this run may use 4 cores"
    )
    flat = Measured("datapipe", rates={1: 300.0, 2: 320.0, 4: 310.0})
    assert "does not scale with workers (300 images/s with 1, 320 at best with 2)" in shortfall(
        flat, ceiling=1000.0, cores=4
    )
    # One core (a container's CPU quota): one count, nothing to say how it scales.
    alone = Measured("dataset", rates={1: 1315.0})
    assert shortfall(alone, ceiling=8064.0, cores=1) == (
        "1,315 images/s with 1 worker, one per core this run may use; at that rate per worker, "
        "the device needs 7 workers"
    )
    advice = _advice(scales, flat)
    assert advice.verdict().startswith("No loader keeps resnet50 on cuda:0 fed")
    assert "the closest is dataset, at 40% with 4 workers" in advice.verdict()


def test_loaders_shared_memory_cannot_hold_are_not_blamed_on_the_budget():
    from facebench.advise.measure import SHM_NOTE

    note = f"{SHM_NOTE} from n_workers=1: its 1 worker process hands ..., but /dev/shm has ..."
    skipped = [Measured("dataset", note=note), Measured("pickle", note=note)]
    verdict = _advice(*skipped).verdict()
    assert verdict.startswith("Nothing was measured: shared memory (/dev/shm) cannot hold")
    assert "budget_s" not in verdict
    rows = {row[0]: row for row in _advice(*skipped).rows()}
    assert rows["dataset"][7] == note  # why not
    # One measured, others skipped: the table says why for those, the answer is the measured.
    measured = Measured("raw", rates={1: 5000.0}, note="")
    assert _advice(measured, *skipped).verdict().startswith("Use loader=raw n_workers=1")


def test_worker_counts_double_up_to_the_cores(monkeypatch):
    monkeypatch.setattr("facebench.advise.measure.usable_cores", lambda: 16)
    assert worker_counts([]) == [1, 2, 4, 8, 16]
    assert worker_counts([3, 1, 3]) == [1, 3]


def test_a_budget_too_small_to_measure_any_loader_says_what_to_raise(make_cfg, synthetic_root):
    advice = advise(make_cfg("model=resnet18", "amp=off", "budget_s=1", config_name="advise"))
    text = advice.markdown()
    assert "Nothing was measured: budget_s=1 ran out" in text
    assert "Raise budget_s to about" in text and "a smaller batch_size" in text
    # No loader is advised or blamed on the strength of nothing.
    assert "Use loader=" not in text and "closest is" not in text


def test_advise_without_a_model_says_so_and_names_no_loader(make_cfg):
    with pytest.raises(ConfigError) as raised:
        advise(make_cfg("model=none", "budget_s=5", config_name="advise"))
    message = str(raised.value)
    assert message.startswith("model=none: advise finds the loaders that keep a model fed")
    assert "loader=" not in message  # the user chose none (it once blamed the compute ceiling)


@pytest.mark.ray
@pytest.mark.slow
def test_advise_answers_on_a_tiny_synthetic_set(tmp_path, cache, synthetic_root):
    out = tmp_path / "advice"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "facebench.advise",
            f"data.cache_dir={cache}",
            "data.n_images=120",
            "sample_images=60",  # measured on a sample, linked into the cache
            "model=resnet18",
            "amp=off",
            "batch_size=8",
            "shard_size=20",
            "device=cpu",
            "budget_s=90",
            "tracking=false",
            f"hydra.run.dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=PROJECT_ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    text = (out / "advice.md").read_text()
    assert text in result.stdout
    assert "## facebench advise: resnet18 on cpu" in text
    assert "Use loader=" in text or "No loader keeps" in text
    assert "Measured on a sample of 60 images" in text and "Data: 120 images" in text
    for loader in ("dataset", "datapipe", "pickle", "raw", "webdataset", "nodes"):
        assert f"| {loader} | " in text, loader
    assert (out / "advice.png").stat().st_size > 10_000


@pytest.mark.slow  # the command line itself
def test_advise_is_a_hydra_app_that_shows_its_keys():
    result = subprocess.run(
        [sys.executable, "-m", "facebench.advise", "budget_s=42", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "budget_s: 42.0" in result.stdout and "sample_images: 20000" in result.stdout
    assert "loader:" in result.stdout  # train.py's keys too


def test_why_not_names_the_costly_stage_and_a_loader_that_pays_less_for_it():
    # CPU time decides, not wall time: here the workers waited longest inside transform (more
    # workers than cores), but decode is what their work costs.
    decoding = {"stage_read_us": 50.0, "stage_decode_us": 700.0, "stage_transform_us": 900.0}
    decoding |= {"stage_read_cpu_us": 40.0, "stage_decode_cpu_us": 640.0}
    decoding |= {"stage_transform_cpu_us": 300.0, "stage_read_cpu_frac": 0.04}
    decoding |= {"stage_decode_cpu_frac": 0.64, "stage_transform_cpu_frac": 0.3}
    decoding |= {"stage_read_frac": 0.03, "stage_decode_frac": 0.42, "stage_transform_frac": 0.55}
    slow = Measured("dataset", rates={1: 100.0, 2: 200.0}, stages={2: decoding})
    pre_decoded = {"stage_read_cpu_us": 20.0, "stage_decode_cpu_us": 0.0}
    pre_decoded |= {"stage_read_cpu_frac": 0.95, "stage_decode_cpu_frac": 0.0}
    fast = Measured("raw", rates={1: 5000.0}, stages={1: pre_decoded})
    why = shortfall(slow, ceiling=1000.0, cores=2, others=[slow, fast])
    assert why.endswith(
        "decode: 64% of the workers' CPU time per image; loader=raw spends 0 us per image "
        "there (this one 640)"
    )
    # Nothing measured pays less for it: the stage alone is named.
    alone = shortfall(slow, ceiling=1000.0, cores=2, others=[slow])
    assert alone.endswith("decode: 64% of the workers' CPU time per image")


class _Steps:
    """A trainer whose steps take `per_image` seconds an image on a fake clock, the first two of
    each batch size `first` times longer (allocation and kernel choice), and every other timed
    step `jitter` times longer (other work on the machine). The fake clock makes the
    measurement exact, however busy the machine running the test."""

    def __init__(self, per_image: float, first: float = 3.0, jitter: float = 1.0) -> None:
        self.per_image, self.first, self.jitter = per_image, first, jitter
        self.calls: dict[int, int] = {}
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def step(self, images, labels) -> None:
        n = len(images)
        self.calls[n] = self.calls.get(n, 0) + 1
        factor = self.first if self.calls[n] <= 2 else self.jitter if self.calls[n] % 2 else 1.0
        self.now += self.per_image * n * factor


def _ceiling(make_cfg, monkeypatch, trainer: _Steps, seconds: float):
    from facebench.advise import ceiling
    from facebench.data.job_data import list_data
    from facebench.run.job import Job

    monkeypatch.setattr(Job, "trainer", lambda *args: trainer)
    monkeypatch.setattr(ceiling, "clock", trainer.clock)
    cfg = make_cfg("model=resnet18", "amp=off", "batch_size=100", config_name="advise")
    job = Job.start(cfg)
    return ceiling.measure_ceiling(cfg, job, list_data(cfg, job.world), seconds)


def test_the_ceiling_leaves_warm_up_steps_out_and_takes_the_median(make_cfg, monkeypatch):
    # 1 ms an image: 1,000 images/s. The probe (8 images a step) says that the warm-up and
    # five steps of 100 would not fit in what is left of 0.6 s; of 64 they do. Counted with
    # its slow first steps, the rate would be far lower.
    measured = _ceiling(make_cfg, monkeypatch, _Steps(0.001), seconds=0.6)
    assert measured.batch_size == 64 and measured.smaller_batch
    assert measured.images_per_s == pytest.approx(1000)
    assert measured.steps >= 5 and measured.spread == pytest.approx(0.0, abs=1e-9)
    assert not measured.noisy
    assert "measured with batch_size=64, not 100" in measured.note()
    assert "noisy" not in measured.note()


def test_a_ceiling_whose_steps_disagree_is_called_noisy(make_cfg, monkeypatch):
    measured = _ceiling(make_cfg, monkeypatch, _Steps(0.0005, jitter=2.0), seconds=2.0)
    assert measured.noisy and measured.spread >= 0.5  # steps of 1x and 2x
    assert f"a noisy measurement: its {measured.steps} timed steps differed by" in measured.note()


def test_a_loader_with_headroom_and_no_shards_beats_a_faster_one_with_shards():
    """When every loader keeps up with room to spare, the one with nothing to build wins."""
    plain = Measured("dataset", rates={1: 1300.0, 2: 2500.0})
    sharded = Measured("raw", rates={1: 50_000.0}, prepare_s=12.0, shard_bytes=2_000_000_000)
    verdict = _advice(plain, sharded).verdict()
    assert verdict.startswith(
        "Use loader=dataset n_workers=1: it keeps resnet50 on cuda:0 fed (1,300 images/s "
        "against 1,000: 30% headroom)"
    )
    assert "faster, but with shards to build first: raw (50,000 images/s)" in verdict
    # Without 20% to spare, the loader that keeps up with the fewest workers and most room.
    tight = Measured("dataset", rates={1: 1100.0})
    assert _advice(tight, sharded).verdict().startswith("Use loader=raw n_workers=1")


def test_an_emulated_accelerator_is_the_ceiling_and_says_how_many_a_host_feeds(monkeypatch):
    slow = Measured("dataset", rates={1: 300.0, 2: 450.0})
    fast = Measured("raw", rates={1: 40_000.0}, prepare_s=1.0, shard_bytes=10**9)
    # The pace: an h100's 8,960 images/s x min_au 0.90.
    advice = _advice(slow, fast, ceiling=8064.0)
    advice.accelerator_rate, advice.accelerator_name = 8960.0, "h100"
    advice.device = "an emulated h100"
    monkeypatch.setattr("facebench.advise.answer.usable_cores", lambda: 16)
    rows = {row[0]: row for row in advice.rows()}
    # 40,000 / 8,064: four by its rate; 16 cores give eight a loop and one worker each. The
    # cell says which of the two limits the count.
    assert rows["raw"][-1] == "about 4: its rate, 4.96x one's pace"
    assert rows["dataset"][-1] == "0 (AU about 5% with one)"  # 450 of 8,960
    monkeypatch.setattr("facebench.advise.answer.usable_cores", lambda: 2)
    assert {row[0]: row for row in advice.rows()}["raw"][-1] == (
        "about 1: 2 cores, and each rank needs 2 (its loop's 1 and 1 worker)"
    )
    # A loop that idles while it waits (host_cpu 0) still takes a sliver: two ranks then fit.
    advice.accelerator_host_cpu = 0.0
    assert {row[0]: row for row in advice.rows()}["raw"][-1] == (
        "about 1: 2 cores, and each rank needs 1.1 (its loop's 0.1 and 1 worker)"
    )
    advice.accelerator_host_cpu = 1.0
    verdict = advice.verdict()
    assert verdict.startswith(
        "Use loader=raw n_workers=1: it keeps an emulated h100 fed (40,000 images/s against "
        "8,064: 5x its pace)"
    )
    # 5x its pace, yet one per host: the verdict says why.
    assert (
        "One host feeds about 1 at once, limited by 2 cores, and each rank needs 2 (its loop's "
        "1 and 1 worker): an estimate"
    ) in verdict
    # Feeding none: its AU with one, and the stage that costs its workers most.
    slow.stages = {
        2: {
            "stage_decode_cpu_frac": 0.55,
            "stage_decode_frac": 0.5,
            "stage_read_cpu_frac": 0.1,
            "stage_read_frac": 0.2,
        }
    }
    assert {row[0]: row for row in advice.rows()}["dataset"][-1] == (
        "0 (AU about 5% with one, held back by decode 55%)"
    )
    assert "accelerator=h100 accelerators_per_host=1,2,4 loader=raw n_workers=1" in verdict
    assert "accelerators per host" in advice.markdown()


def test_advises_mlflow_run_is_named_without_spaces_or_an_article(tmp_path, monkeypatch):
    from contextlib import contextmanager

    from facebench.advise.run import record

    named: list[tuple[str, dict]] = []

    class Recorder:
        def __init__(self, **_: object) -> None:
            pass

        @contextmanager
        def run(self, name: str, params: dict, tags: dict):
            named.append((name, params))
            yield

        def log_metrics(self, *_: object) -> None:
            pass

        def log_artifact(self, *_: object) -> None:
            pass

    monkeypatch.setattr("facebench.advise.run.Tracker", Recorder)
    emulated = _advice(Measured("raw", rates={1: 40_000.0}), ceiling=8064.0)
    emulated.accelerator_rate, emulated.accelerator_name = 8960.0, "h100"
    emulated.device = "an emulated h100"
    record(emulated, True, tmp_path / "emulated")
    plain = _advice(Measured("raw", rates={1: 40_000.0}))
    plain.device = "cpu"
    record(plain, True, tmp_path / "plain")
    assert [name for name, _ in named] == ["advise-h100", "advise-resnet50-cpu"]
    assert named[0][1]["accelerator"] == "h100"


def _from_bucket(
    requests: int, seen: float, mean_ms: float, mb: float, per_s: float = 380.0, **more: float
) -> dict:
    """A measurement's metrics from a bucket as facebench/fetches.py publishes them: `requests`
    GETs of `mean_ms` each at `per_s` a second, `seen` images, `mb` MB fetched in all."""
    fetches = Fetches()
    for _ in range(requests):
        fetches.add_get(round(mb * 1e6 / requests), round(mean_ms * 1e6), 1_000_000, 0, 0)
    return {**fetches.metrics(requests / per_s), "samples_seen": seen, **more}


def test_from_a_bucket_the_storage_limit_is_named_and_bounds_the_host(monkeypatch):
    monkeypatch.setattr("facebench.advise.answer.usable_cores", lambda: 16)
    # Per image: 380 images/s with 16 GETs of 42 ms in flight, the workers' CPU mostly idle.
    per_image = Measured("dataset", rates={2: 380.0})
    per_image.stages = {2: _from_bucket(6000, 6000, 42.0, 100.0, stage_worker_cpu_us=900.0)}
    # Shards: 100 images a GET; fast enough for six h100s by its rate alone.
    shards = Measured("pickle", rates={1: 50_000.0}, prepare_s=3.0, shard_bytes=10**9)
    shards.stages = {1: _from_bucket(60, 6000, 90.0, 240.0, 500.0, stage_worker_cpu_us=30.0)}
    advice = _advice(per_image, shards, ceiling=8064.0)
    advice.accelerator_rate, advice.accelerator_name = 8960.0, "h100"
    advice.device = "an emulated h100"
    advice.storage = "s3://facebench/data, at S3 Standard (emulated)"
    advice.distance = Distance(latency_ms=20, requests_per_s=450)
    rows = {row[0]: row for row in advice.rows()}
    # 380 requests/s x 42 ms on average: 16 in flight (Little's law); latency is what holds it.
    assert rows["dataset"][7].startswith(
        "held back by latency: about 16 requests in flight of 42 ms each (the mean), 380 "
        "requests/s "
        "of 1 images"
    )
    assert rows["dataset"][-1] == (
        "0 (AU about 4% with one, held back by latency (16 requests in flight of 42 ms))"
    )
    # 450 requests/s x 100 images = 45,000 images/s for the whole host: 5 h100s, not the 6 its
    # one rank's rate would give (its one rank is near the prefix's rate already).
    assert rows["pickle"][-1] == "about 5: the prefix's 450 requests/s, 100 images a request"
    assert rows["pickle"][7] == ""  # it keeps one fed
    # A loader whose workers are busy computing is not blamed on the storage.
    per_image.stages[2]["stage_worker_cpu_us"] = 5000.0  # 380 x 5 ms: 1.9 cores of 2
    assert "held back by latency" not in {row[0]: row for row in advice.rows()}["dataset"][7]
    assert "keeps an emulated h100 from s3://facebench/data" in advice.verdict()


@pytest.mark.parametrize(
    ("distance", "metrics", "limit"),
    [
        # 503s, or a rate at the prefix's: the request rate.
        (Distance(requests_per_s=500), {"storage_throttled": 12.0}, "the request rate: 380 of 500"),
        # 20 MB a GET at 100 Mbit/s: 1.6 s, far beyond 20 ms.
        (Distance(latency_ms=20, bandwidth_mbps=100), {"storage_bytes": 20e6 * 6000},
         "each connection's bandwidth (1,600 ms a request)"),
        # The link full.
        (Distance(total_mbps=500), {"storage_mb_per_s": 60.0}, "the host's link: 480 of its 500"),
        # The endpoint answered most requests after the emulated latency.
        (Distance(latency_ms=5), {"storage_relay_late_frac": 0.8}, "the endpoint itself"),
        (Distance(latency_ms=20), {}, "latency (16 requests in flight of 42 ms)"),
    ],
)  # fmt: skip
def test_the_limit_a_bucket_run_meets_first(distance, metrics, limit):
    found = holding_back(
        {**_from_bucket(6000, 6000, 42.0, 100.0, stage_worker_cpu_us=900.0), **metrics},
        380.0, distance, 2, 2,
    )  # fmt: skip
    assert found is not None and found.short.startswith(limit)
    # Local files: no storage limit at all.
    assert holding_back({"stage_worker_cpu_us": 900.0}, 380.0, distance, 2, 2) is None


@pytest.mark.parametrize(
    ("realtime", "why"),
    [(1.0, "under real-time scheduling, behind its own work (it kept 40% of its one core busy)"),
     (0.0, "without real-time scheduling, it waited for a core behind the loader's workers")],
)  # fmt: skip
def test_a_late_relay_says_whether_it_ran_in_real_time(realtime, why):
    """Answered late from the copy: the relay held the run, and the line says why, naming the
    key and the limit that allow real-time scheduling where it ran without."""
    metrics = {
        **_from_bucket(6000, 6000, 42.0, 100.0, stage_worker_cpu_us=900.0),
        "storage_relay_late_frac": 0.6, "storage_relay_endpoint_frac": 0.0,
        "storage_relay_realtime": realtime, "storage_relay_cpu_frac": 0.4,
    }  # fmt: skip
    found = holding_back(metrics, 380.0, Distance(latency_ms=20), 2, 2)
    assert found is not None and found.kind == "the relay"
    assert f"60% of its answers left after their emulated time, {why}" in found.detail


def test_a_rate_is_held_to_the_bounds_its_own_requests_allow():
    # 380 GETs a second of 42 ms each: 16 in flight, which at the emulated 20 ms allow 798.
    run = _from_bucket(6000, 6000, 42.0, 100.0, storage_emulated_mean_ms=20.0)
    bounds = Bounds.of(run, Distance(latency_ms=20, requests_per_s=5500))
    assert bounds.distance == pytest.approx(380 * 0.042 / 0.020)
    assert bounds.request_rate == 5500  # one image a request
    assert not bounds.beyond(380.0) and not bounds.beyond(850.0)
    # A steady rate its epoch's requests could not have fed: the window missed the reads.
    assert bounds.beyond(117_888.0)
    # Shards: 100 images a GET of 4 MB at 700 Mbit/s (46 ms) after 20 ms, 2 in flight.
    shards = _from_bucket(60, 6000, 66.0, 240.0, 30.0, storage_emulated_mean_ms=20.0)
    found = Bounds.of(shards, Distance(latency_ms=20, bandwidth_mbps=700, requests_per_s=5500))
    in_flight = 30 * 0.066
    assert found.distance == pytest.approx(in_flight / (0.020 + 4e6 * 8 / 700e6) * 100)
    assert found.request_rate == 550_000
    assert Bounds.of({"samples_seen": 10.0}, Distance(latency_ms=20)) is None  # local files


def test_advise_says_what_feeding_an_accelerator_from_the_bucket_takes():
    per_image = Measured("dataset", rates={2: 380.0})
    per_image.stages = {2: _from_bucket(6000, 6000, 42.0, 100.0, stage_read_cpu_us=20.0,
                                        stage_worker_cpu_us=650.0)}  # fmt: skip
    shards = Measured("pickle", rates={2: 1200.0}, shard_bytes=10**9)
    shards.stages = {2: _from_bucket(60, 6000, 300.0, 240.0, 10.0)}  # 40 kB an image
    s3 = Distance(latency_ms=20, latency_p99_ms=100, bandwidth_mbps=700, requests_per_s=5500)
    said = what_it_takes(8064.0, s3, [per_image, shards])
    mean_ms = 20 * math.exp((math.log(5) / 2.3263478740408408) ** 2 / 2)  # 25.4: the tail's
    assert said.startswith(
        f"From this bucket, an accelerator taking 8,064 images/s needs, by Little's law, "
        f"{8064 * mean_ms / 1000:,.0f} GETs in flight of one image each at its {mean_ms:,.1f} ms "
    )
    assert "8,064 requests/s exceed one prefix's 5,500: spread the set over prefixes" in said
    assert "0.65 ms a GET at best measured here, costs 5.2 cores per accelerator" in said
    # 87.5 MB/s a connection over 40 kB an image: 2,188 images/s; 4 at once for 8,064.
    assert "Shards of 40 kB an image reach a connection's 700 Mbit/s from about 500" in said
    assert "2,188 images/s a connection: 4 fetching at once per accelerator" in said
    assert what_it_takes(8064.0, Distance(), [per_image]) == ""  # no distance emulated


def test_what_held_a_bucket_run_is_named():
    stages = {"stage_read_cpu_us": 20.0, "stage_decode_cpu_us": 500.0,
              "stage_transform_cpu_us": 300.0, "stage_collate_cpu_us": 80.0}  # fmt: skip
    run = _from_bucket(6000, 6000, 42.0, 100.0, **stages)
    # Idle workers, waiting on 16 GETs in flight: the distance.
    idle = {**run, "stage_worker_cpu_us": 1000.0}
    assert held_by(idle, 380.0, Distance(latency_ms=20), 2, 2) == "the distance"
    # Busy: 380 x 4.9 ms is 1.9 cores of 2. The client's threads took 4 ms an image outside
    # every stage (the CRT client's event loop): the client's CPU, not the decode.
    client = {**run, "stage_worker_cpu_us": 4900.0}
    assert client_cpu_us(client) == pytest.approx(20.0 + 4000.0)
    assert held_by(client, 380.0, Distance(latency_ms=20), 2, 2) == "the client's CPU"
    decode = {**run, "stage_worker_cpu_us": 4900.0, "stage_decode_cpu_us": 4400.0}
    assert held_by(decode, 380.0, Distance(latency_ms=20), 2, 2) == "the decode"
    # Answered late: by the endpoint (relayed), or by the relay itself (from its copy).
    late = {**idle, "storage_relay_late_frac": 0.8}
    endpoint = {**late, "storage_relay_endpoint_frac": 1.0}
    assert held_by(endpoint, 380.0, Distance(latency_ms=20), 2, 2) == "the endpoint"
    copy = {**late, "storage_relay_endpoint_frac": 0.0}
    assert held_by(copy, 380.0, Distance(latency_ms=20), 2, 2) == "the relay"
    assert held_by({"stage_worker_cpu_us": 1.0}, 380.0, Distance(), 2, 2) is None  # local


def test_no_storage_limit_is_named_where_it_cannot_be_told():
    bucket = _from_bucket(6000, 6000, 42.0, 100.0)
    # Workers' CPU not broken down (DALI's threads): the CPU may be the bound, so no blame.
    assert holding_back(bucket, 380.0, Distance(latency_ms=20), 2, 2) is None
    # Each rank's accelerator spins half a core (rank 0's figure); two ranks' 760 images/s at
    # 1.4 ms of CPU each keep 1.06 of the one core left to their workers busy: CPU-bound. Read
    # as one rank, half a core spun, the same run would have looked idle and blamed latency.
    busy = {**bucket, "stage_worker_cpu_us": 1400.0, "accelerator_host_cpu_s": 5.0,
            "epoch_time_s": 10.0}  # fmt: skip
    assert holding_back(busy, 760.0, Distance(latency_ms=20), 4, 2, ranks=2) is None
    assert holding_back(busy, 760.0, Distance(latency_ms=20), 4, 2, ranks=1) is not None
    # No latency emulated: no answer is "late", and the bandwidth is what shows.
    slow = {**bucket, "stage_worker_cpu_us": 900.0, "storage_relay_late_frac": 1.0,
            "storage_bytes": 20e6 * 6000}  # fmt: skip
    found = holding_back(slow, 380.0, Distance(bandwidth_mbps=100), 2, 2)
    assert found is not None and found.short.startswith("each connection's bandwidth")
