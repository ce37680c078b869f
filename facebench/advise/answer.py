"""What advise found, as a verdict and a table."""

from __future__ import annotations

from dataclasses import dataclass, field

from facebench import stages
from facebench.advise.by_cost import said as bills_said
from facebench.advise.from_bucket import in_flight, what_it_takes
from facebench.advise.measure import HEADROOM, SHM_NOTE, Measured, shortfall
from facebench.costs import Prices
from facebench.host.printable import printable
from facebench.host.resources import LOOP_MIN, cores_per_rank, ranks_that_fit, usable_cores
from facebench.report.tables import markdown
from facebench.shards import room
from facebench.storage.distance import Distance
from facebench.storage.limits import Limit, holding_back, hosts_allowed

LOADER_MIN_S = 10.0  # what one loader needs at least: shards for a sample, a few short runs


@dataclass
class Advice:
    """What advise found, and how it says so."""

    model: str
    device: str
    ceiling: float
    n_images: int
    n_sample: int
    measured: list[Measured]
    seconds: float
    budget_s: float
    counts: list[int] = field(default_factory=lambda: [1])
    ceiling_s: float = 0.0  # time spent measuring the ceiling
    ceiling_note: str = ""  # how the ceiling was measured, when not with the batch asked for
    # An emulated accelerator's rate (its pace to keep is `ceiling`, this x its min_au): say
    # how many of them one host's loaders feed (estimated). 0: a real device.
    accelerator_rate: float = 0.0
    accelerator_name: str = ""
    accelerator_host_cpu: float = 1.0  # the share of a core each rank's loop keeps busy
    # Where the data were read: '' for local files, else the bucket (and its emulated distance),
    # the distance's limits (all 0 where none was emulated), and the GETs each worker keeps in
    # flight (storage.requests_per_worker).
    storage: str = ""
    distance: Distance = field(default_factory=Distance)
    requests_per_worker: int = 8
    prices: Prices | None = None  # conf/cost/'s, for this storage and accelerator
    client: str = "crt"  # storage.client
    # Where a user's own pipeline spends its time, what a change would give (advise/own.py).
    inside: list[str] = field(default_factory=list)

    @property
    def per_host(self) -> bool:
        return self.accelerator_rate > 0

    @property
    def run_name(self) -> str:
        """Its MLflow run's name, without spaces: advise-resnet50-cpu, or advise-h100 for an
        emulated accelerator (the model plays no part there)."""
        if self.per_host:
            return f"advise-{self.accelerator_name}"
        return f"advise-{self.model}-{self.device}".replace(" ", "-")

    @property
    def target(self) -> str:
        """What is to be kept fed: 'resnet50 on cuda:0', or 'an emulated h100'; and from
        where, when the data are in a bucket."""
        target = f"{self.model} on {self.device}" if not self.per_host else self.device
        return f"{target} from {self.storage}" if self.storage else target

    def storage_limit(self, measured: Measured) -> Limit | None:
        """What held a loader reading a bucket back at its best worker count: latency, a
        bandwidth, the request rate, the endpoint; None from local files or where its workers'
        CPU was the bound."""
        if not self.storage or not measured.rates:
            return None
        workers, best = measured.best()
        return holding_back(
            measured.stages.get(workers, {}), best, self.distance, workers, usable_cores()
        )

    def ordered(self) -> list[Measured]:
        """Loaders that keep the device fed first (fewest workers, then fastest), then the rest."""

        def key(m: Measured) -> tuple:
            fewest = m.fewest_feeding(self.ceiling)
            return (fewest is None, fewest or 0, -m.best()[1])

        return sorted(self.measured, key=key)

    def scale(self) -> float:
        return self.n_images / max(1, self.n_sample)

    def rows(self) -> list[list[str]]:
        rows = []
        cores = usable_cores()
        for m in self.ordered():
            fewest = m.fewest_feeding(self.ceiling)
            best_workers, best = m.best()
            rate = min(self.ceiling, best) if m.rates else 0.0
            epoch = f"{self.n_images / rate:,.0f} s" if rate and self.n_images else "n/a"
            rows.append(
                [
                    m.name,
                    "yes" if fewest is not None else "no",
                    str(fewest) if fewest is not None else "-",
                    f"{best:,.0f} ({best_workers})" if m.rates else "-",
                    epoch,
                    f"{m.prepare_s * self.scale():,.1f} s" if m.shard_bytes else "-",
                    room.gb(m.shard_bytes * self.scale()) if m.shard_bytes else "-",
                    "" if fewest is not None else self.why_not(m, cores),
                    *([self.fed_per_host(m, cores)] if self.per_host else []),
                ]
            )
        return rows

    def why_not(self, measured: Measured, cores: int) -> str:
        """Why a loader does not keep the device fed: the storage's limit first, where one
        held it back, then how it scales and its costliest stage."""
        limit = self.storage_limit(measured)
        if limit is None:
            return shortfall(measured, self.ceiling, cores, self.measured)
        note = f"; {measured.note}" if measured.note else ""
        return f"held back by {limit.detail}{note}"

    def fed_per_host(self, measured: Measured, cores: int) -> str:
        """An estimate of how many accelerators it feeds on this host at once, and what limits
        the count: its best rate over the pace, or the host's cores where they cannot give each
        rank its loop and its workers (measured here: a loader whose one rank fed six h100s by
        its rate fed one of two ranks, its cores shared by both); or, feeding none, its AU with
        one and the stage that costs its workers most."""
        if not measured.rates:
            return "-"
        estimate = self.per_host_estimate(*measured.best(), cores, measured)
        if estimate is not None:
            return f"about {estimate[0]}: {estimate[1]}"
        best = measured.best()[1]
        limit = self.storage_limit(measured)
        costly = (
            limit.short
            if limit
            else stages.dominant_label(measured.stages.get(measured.best()[0], {}))
        )
        held = f", held back by {costly}" if costly else ""
        return f"0 (AU about {best / self.accelerator_rate:.0%} with one{held})"

    def per_host_estimate(
        self, workers: int, best: float, cores: int, measured: Measured | None = None
    ) -> tuple[int, str] | None:
        """(accelerators one host feeds at once, what limits the count), from a loader's rate
        with `workers` workers and this host's cores, and from a bucket, the limits every rank
        shares (the prefix's request rate, the host's link); None where it feeds not even
        one."""
        if best < self.ceiling:
            return None
        loop = max(LOOP_MIN, self.accelerator_host_cpu)  # each rank's, as it waits
        plural = "s" if workers > 1 else ""
        limits = [
            (int(best // self.ceiling), 2, f"its rate, {best / self.ceiling:.2f}x one's pace"),
            (ranks_that_fit(cores, workers, loop), 1, f"{cores} cores, and each rank needs "
             f"{cores_per_rank(workers, loop):g} (its loop's {loop:g} and {workers} "
             f"worker{plural})"),
        ]  # fmt: skip
        shared = (
            hosts_allowed(measured.stages.get(workers, {}), self.distance, self.ceiling)
            if measured is not None and self.storage
            else None
        )
        if shared is not None:  # every rank's GETs go to one prefix, over one link
            limits.append((max(1, shared[0]), 0, shared[1]))
        # The tightest; where two agree, the storage's before the cores, the cores before
        # the rate: the one a faster loader would not lift.
        most, _, limit = min(limits)
        return most, limit

    def verdict(self) -> str:
        if not any(m.rates for m in self.measured):
            if self.measured and all(m.note.startswith(SHM_NOTE) for m in self.measured):
                return (
                    "Nothing was measured: shared memory (/dev/shm) cannot hold the batches of "
                    "any loader's workers here (see why not). Give it more (docker run "
                    "--shm-size), or measure smaller batches (batch_size)."
                )
            return self.nothing_measured()
        fed = [m for m in self.measured if m.fewest_feeding(self.ceiling) is not None]
        if not fed:
            best = max(self.measured, key=lambda m: m.best()[1])
            share = 100 * best.best()[1] / self.ceiling if self.ceiling else 0
            return (
                f"No loader keeps {self.target} fed ({self.ceiling:,.0f} "
                f"images/s); the closest is {best.name}, at {share:.0f}% with "
                f"{best.best()[0]} workers."
            )
        chosen, workers = self.choice(fed)
        rate = chosen.rates[workers]
        epoch = self.n_images / self.ceiling
        ratio = rate / self.ceiling
        headroom = f"{ratio:.0f}x its pace" if ratio >= 2 else f"{ratio - 1:.0%} headroom"
        text = (
            f"Use loader={chosen.name} n_workers={workers}: it keeps {self.target} fed "
            f"({rate:,.0f} images/s against {self.ceiling:,.0f}: {headroom}), one epoch of "
            f"{self.n_images:,} images in about {epoch:,.0f} s."
        )
        if self.storage:
            metrics = chosen.stages.get(workers, {})
            text += in_flight(metrics, rate, self.requests_per_worker, self.storage_limit(chosen))
        if self.per_host:
            count, limit = self.per_host_estimate(workers, rate, usable_cores(), chosen) or (0, "")
            text += (
                f" One host feeds about {count} at once, limited by {limit}: an estimate; "
                f"python train.py -m accelerator={self.accelerator_name} "
                f"accelerators_per_host=1,2,4 loader={chosen.name} n_workers={workers} "
                "measures them."
            )
        return text + self._what_else(chosen, fed)

    def choice(self, fed: list[Measured]) -> tuple[Measured, int]:
        """Among the loaders that keep the device fed with HEADROOM to spare, the one that needs
        no shard build (then the fewest workers, then the fastest): a loader as fast as needed
        with nothing to build first and no disk to spend beats a faster one. Without any so
        roomy, the one that keeps it fed with the fewest workers, then the fastest."""
        roomy = [(m, m.fewest_feeding(HEADROOM * self.ceiling)) for m in fed]
        roomy = [(m, w) for m, w in roomy if w is not None]
        if roomy:
            return min(roomy, key=lambda mw: (mw[0].shard_bytes > 0, mw[1], -mw[0].best()[1]))
        return min(
            ((m, m.fewest_feeding(self.ceiling) or 0) for m in fed),
            key=lambda mw: (mw[1], -mw[0].best()[1]),
        )

    def _what_else(self, chosen: Measured, fed: list[Measured]) -> str:
        """What the faster loaders would add, and the others that keep the device fed."""
        text = ""
        faster = [m for m in fed if m.best()[1] > chosen.best()[1] and m.shard_bytes]
        if not chosen.shard_bytes and faster:
            names = ", ".join(f"{m.name} ({m.best()[1]:,.0f} images/s)" for m in faster)
            text += f" It needs no shard build; faster, but with shards to build first: {names}."
        others = sorted(
            (m.fewest_feeding(self.ceiling) or 0, -m.best()[1], m.name)
            for m in fed
            if m is not chosen
        )
        if others:
            listed = ", ".join(f"{n} ({w})" for w, _, n in others)
            text += f" Also fed, fewest workers first: {listed}."
        fewest = min(self.counts)
        if len(fed) == len(self.measured) and all(
            m.fewest_feeding(self.ceiling) == fewest for m in fed
        ):
            text += " Every loader keeps up with the fewest workers: the model sets the pace here."
        return text

    def nothing_measured(self) -> str:
        """What to change when the budget ran out before any loader was measured."""
        enough = self.ceiling_s + len(self.measured) * LOADER_MIN_S
        smaller = (
            "a smaller batch_size"
            if self.model == "resnet18"
            else "model=resnet18 (amp=off on a CPU)"
        )
        return (
            f"Nothing was measured: budget_s={self.budget_s:,.0f} ran out after "
            f"{self.ceiling_s:,.0f} s on the compute ceiling ({self.model} at "
            f"{self.ceiling:,.1f} images/s), before any loader. Raise budget_s to about "
            f"{enough:,.0f} or more, or measure against {smaller}."
        )

    def markdown(self) -> str:
        header = [
            "loader",
            "keeps it fed",
            "fewest workers",
            "best host-side images/s (workers)",
            "predicted epoch",
            "shard build",
            "shard disk",
            "why not",
            *(["accelerators per host"] if self.per_host else []),
        ]
        sampled = (
            f" Measured on a sample of {self.n_sample:,} images; build time and disk are "
            "scaled to the whole set."
            if self.n_sample < self.n_images
            else ""
        )
        needs = what_it_takes(self.ceiling, self.distance, self.measured) if self.storage else ""
        if self.prices is not None:
            pace = self.accelerator_rate or self.ceiling
            bills = bills_said(self.measured, self.prices, pace, self.n_images, self.client)
            needs = f"{needs}\n\n{bills}".strip() if bills else needs
        return printable(
            f"## facebench advise: {self.target}\n\n{self.verdict()}\n\n"
            + "".join(f"{line}\n\n" for line in self.inside)
            + (f"{needs}\n\n" if needs else "")
            + f"Compute ceiling: {self.ceiling:,.0f} images/s{self.ceiling_note}. "
            f"Data: {self.n_images:,} images."
            f"{sampled} Took {self.seconds:,.0f} s of a {self.budget_s:,.0f} s budget.\n\n"
            + markdown(header, self.rows())
        )
