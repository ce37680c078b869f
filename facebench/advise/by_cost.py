"""What advise says of the money: each loader that keeps the accelerator fed, ranked by what an
epoch of the whole set costs at the prices of conf/cost/ (facebench/costs.py), and what its
per-image GETs cost against a shard loader's few.

A fed loader trains at the accelerator's pace, so the accelerator-hours of an epoch are the same
for each (n_images over that pace, at min_au or better): what sets them apart is the requests
and the bytes. One that is not fed stretches the epoch to its own rate, and the hours the
accelerator waits are billed too.
"""

from __future__ import annotations

from facebench.advise.measure import Measured
from facebench.costs import EpochCost, Prices


def epoch_cost(
    measured: Measured, workers: int, prices: Prices, pace: float, n_images: int
) -> EpochCost | None:
    """One epoch of `n_images` for a loader at `workers`, trained at the slower of its rate and
    the accelerator's `pace` (idle for the rest)."""
    rate = measured.rates.get(workers, 0.0)
    metrics = measured.stages.get(workers, {})
    seen = metrics.get("samples_seen", 0.0)
    if rate <= 0 or not seen:
        return None
    trained = min(rate, pace) if pace else rate
    fed = {**metrics, "steady_images_per_s": trained}
    if pace:
        fed["au"] = trained / pace
    return EpochCost.of(prices, fed, 1, n_images)


def ranked(
    measured: list[Measured], prices: Prices, pace: float, n_images: int
) -> list[tuple[float, Measured, int, EpochCost]]:
    """The loaders whose epoch's bill is known, cheapest first, each at its fewest workers that
    keep the accelerator fed (else its fastest)."""
    found = []
    for one in measured:
        workers = one.fewest_feeding(pace) or one.best()[0]
        cost = epoch_cost(one, workers, prices, pace, n_images)
        if cost is not None and cost.total_usd is not None:
            found.append((cost.total_usd, one, workers, cost))
    return sorted(found, key=lambda item: (item[0], item[1].name))


def said(measured: list[Measured], prices: Prices, pace: float, n_images: int, client: str) -> str:
    """A paragraph: the cheapest loader (and client) per epoch, the others' bills, and what
    the per-image loaders' GETs cost beyond the shards'; '' where no bill is known."""
    bills = ranked(measured, prices, pace, n_images)
    if not bills:
        return ""
    fed = [bill for bill in bills if bill[1].fewest_feeding(pace) is not None] if pace else bills
    listed = "; ".join(
        f"{one.name} ({workers} workers) ${usd:,.2f}: {cost.requests:,.0f} GETs "
        f"${cost.requests_usd or 0:,.2f}, {cost.accelerator_hours:,.2f} accelerator-hours"
        for usd, one, workers, cost in bills
    )
    if fed:
        usd, one, workers, _ = fed[0]
        head = (
            f"Cheapest per epoch of {n_images:,} images among those that keep it fed: "
            f"loader={one.name} n_workers={workers} storage.client={client}, ${usd:,.2f}."
        )
    else:
        head = (
            f"No loader keeps it fed; the cheapest epoch of {n_images:,} images is "
            f"{bills[0][1].name}'s, ${bills[0][0]:,.2f}, idle hours included."
        )
    per_image = [bill for bill in bills if bill[3].requests >= 0.5 * n_images]
    shards = [bill for bill in bills if bill[3].requests < 0.5 * n_images]
    gap = ""
    if per_image and shards:
        most = max(bill[3].requests_usd or 0 for bill in per_image)
        fewest = min(shards, key=lambda bill: bill[3].requests_usd or 0)[3]
        gap = (
            f" Per-image GETs cost up to ${most:,.2f} an epoch in requests alone, shards "
            f"${fewest.requests_usd or 0:,.4f}: {n_images:,} GETs against "
            f"{fewest.requests:,.0f}."
        )
    return f"{head}{gap} Each epoch's bill (conf/cost/, scaled to the whole set): {listed}."
