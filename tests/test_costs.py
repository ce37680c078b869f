"""What an epoch costs: prices from conf/cost/ and the command line, an epoch's bill from a run's
measurements (scaled to a whole set), the upload's, and the config's one-line refusals."""

from __future__ import annotations

import pytest

from facebench.costs import EpochCost, Prices, put_cost
from facebench.errors import ConfigError
from facebench.storage.objects import PART_BYTES, put_requests

# A measured epoch: 3,000 images, one GET each, 40 kB each, at 1,500 images/s, AU 60%.
MEASURED = {
    "samples_seen": 3000.0,
    "storage_requests": 3000.0,
    "storage_bytes": 3000 * 40e3,
    "images_per_s": 1200.0,
    "steady_images_per_s": 1500.0,
    "au": 0.6,
}


def test_prices_are_the_profiles_unless_a_key_replaces_them(make_cfg) -> None:
    cfg = make_cfg("storage=s3", "storage.url=s3://bucket/p", "accelerator=h100")
    listed = Prices.of(cfg.cost, "s3", "h100")
    assert (listed.get_per_1000, listed.put_per_1000, listed.retrieval_per_gb) == (
        0.0004, 0.005, 0.0,
    )  # fmt: skip
    assert listed.gpu_per_hour == pytest.approx(12.29)
    express = Prices.of(cfg.cost, "s3-express", "a100")
    assert (express.get_per_1000, express.retrieval_per_gb, express.gpu_per_hour) == (
        0.00003, 0.0006, 4.10,
    )  # fmt: skip
    custom = Prices.of(cfg.cost, "custom", "none")
    assert custom.get_per_1000 is None and custom.gpu_per_hour is None
    given = make_cfg("storage=s3", "storage.url=s3://bucket/p", "cost.gpu_per_hour=2.10",
                     "cost.get_per_1000=0.001")  # fmt: skip
    mine = Prices.of(given.cost, "s3", "h100")
    assert (mine.gpu_per_hour, mine.get_per_1000, mine.put_per_1000) == (2.10, 0.001, 0.005)
    assert Prices.of(make_cfg("cost=none").cost, "s3", "h100").get_per_1000 is None


def test_an_epochs_bill_is_its_requests_bytes_and_hours() -> None:
    prices = Prices(0.0004, 0.005, 0.005, 0.0006, 0.0032, 12.0)
    cost = EpochCost.of(prices, MEASURED, accelerators=2)
    assert cost is not None
    assert cost.requests == 3000 and cost.gigabytes == pytest.approx(0.12)
    assert cost.requests_usd == pytest.approx(3000 / 1000 * 0.0004)
    assert cost.retrieval_usd == pytest.approx(0.12 * 0.0006)
    hours = 3000 / 1500 / 3600 * 2  # at the steady rate, on two accelerators
    assert cost.accelerator_hours == pytest.approx(hours)
    assert cost.accelerator_usd == pytest.approx(hours * 12.0)
    assert cost.idle_usd == pytest.approx(hours * 12.0 * 0.4)
    assert cost.total_usd == pytest.approx(1.2e-3 + 7.2e-5 + hours * 12.0)
    assert cost.metrics()["cost_epoch_usd"] == pytest.approx(cost.total_usd)
    assert "scaled" not in cost.said()


def test_a_whole_sets_epoch_scales_requests_and_hours_and_says_so() -> None:
    prices = Prices(0.0004, 0.005, 0.005, 0.0, 0.0, 4.0)
    one = EpochCost.of(prices, MEASURED)
    whole = EpochCost.of(prices, MEASURED, epoch_images=1_200_000)
    assert one is not None and whole is not None
    assert whole.requests == pytest.approx(1_200_000)
    assert whole.requests_usd == pytest.approx(0.48)  # 1.2 M GETs at $0.0004 a thousand
    assert whole.accelerator_hours == pytest.approx(one.accelerator_hours * 400)
    assert "1,200,000 images (scaled from the 3,000 measured)" in whole.said()


def test_an_unknown_price_leaves_its_part_and_the_total_out() -> None:
    no_hour = Prices(0.0004, 0.005, 0.005, 0.0, 0.0, None)
    cost = EpochCost.of(no_hour, MEASURED)
    assert cost is not None and cost.accelerator_usd is None and cost.total_usd is None
    assert "cost_epoch_usd" not in cost.metrics()
    assert "cost_requests_usd" in cost.metrics()
    assert "total unknown" in cost.said()
    assert EpochCost.of(no_hour, {"samples_seen": 0.0}) is None
    unpriced = Prices(None, None, None, None, None, 3.0)  # local files: no requests to price
    local = EpochCost.of(unpriced, {**MEASURED, "storage_requests": 0, "storage_bytes": 0})
    assert local is not None and local.requests_usd == 0.0 and local.total_usd is not None


def test_an_uploads_bill_counts_multipart_parts() -> None:
    assert put_requests(PART_BYTES - 1) == 1
    assert put_requests(PART_BYTES) == 3  # start, one part, completion
    assert put_requests(3 * PART_BYTES + 1) == 6
    prices = Prices(0.0004, 0.005, 0.005, 0.0, 0.0032, None)
    assert put_cost(prices, 2000, 3, 0.5) == pytest.approx(0.01 + 0.000015 + 0.0016)
    assert put_cost(Prices(None, None, None, None, None, None), 1, 1, 0.0) is None


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["cost.gpu_per_hour=-1"], r"cost.gpu_per_hour=-1.0: a price must be 0 or more"),
        (["+cost.storage.minio={get_per_1000:0.1}"], r"cost.storage.minio: no storage profile"),
        (["cost.storage.s3.get_per_1000=-0.1"], r"cost.storage.s3.get_per_1000=-0.1: a price"),
        (["cost.get_per_1000=0.1"], r"cost.get_per_1000: storage=local makes no requests"),
        (["cost.epoch_images=-5"], r"cost.epoch_images=-5: 0"),
    ],
)
def test_bad_prices_are_refused_in_one_line(make_cfg, overrides, said) -> None:
    with pytest.raises(ConfigError, match=said):
        make_cfg(*overrides)


def test_advise_ranks_the_fed_loaders_by_their_epochs_bill() -> None:
    """Two loaders keep a 1,000 images/s accelerator fed; the one with fewer GETs (shards) is
    the cheaper epoch of a 1.2 M-image set, and the answer says what per-image GETs cost."""
    from facebench.advise.by_cost import ranked, said
    from facebench.advise.measure import Measured

    def measured(name: str, rate: float, requests: float) -> Measured:
        metrics = {"samples_seen": 3000.0, "storage_requests": requests, "storage_bytes": 1e8}
        return Measured(name, rates={2: rate}, stages={2: metrics})

    per_image, shards = measured("dataset", 1500, 3000), measured("pickle", 2500, 10)
    slow = measured("datapipe", 400, 3000)  # not fed: its epoch takes 2.5x the hours
    prices = Prices(0.0004, 0.005, 0.005, 0.0, 0.0, 4.0)
    bills = ranked([per_image, shards, slow], prices, 1000.0, 1_200_000)
    assert [one.name for _, one, _, _ in bills] == ["pickle", "dataset", "datapipe"]
    hours = 1_200_000 / 1000 / 3600  # at the accelerator's pace, for both fed loaders
    assert bills[0][0] == pytest.approx(hours * 4.0 + 4 * 0.0004)  # 4,000 GETs
    assert bills[1][0] == pytest.approx(hours * 4.0 + 1200 * 0.0004)  # 1.2 M GETs
    assert bills[2][3].idle_usd == pytest.approx(1_200_000 / 400 / 3600 * 4.0 * 0.6)
    text = said([per_image, shards, slow], prices, 1000.0, 1_200_000, "crt")
    assert "Cheapest per epoch of 1,200,000 images among those that keep it fed: " in text
    assert "loader=pickle n_workers=2 storage.client=crt" in text
    assert "Per-image GETs cost up to $0.48 an epoch in requests alone" in text
    assert "1,200,000 GETs against 4,000." in text


def test_a_steady_rate_beyond_its_bounds_is_not_billed() -> None:
    """A run whose steady window missed its reads (storage_beyond_bounds) is billed at the
    whole epoch's rate, the one that includes them, as the run itself compares it."""
    prices = Prices(0.0004, 0.005, 0.005, 0.0, 0.0, 4.0)
    beyond = {**MEASURED, "steady_images_per_s": 50_000.0, "storage_beyond_bounds": 1.0}
    cost = EpochCost.of(prices, beyond)
    assert cost is not None
    assert cost.accelerator_hours == pytest.approx(3000 / 1200 / 3600)
