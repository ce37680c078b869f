"""torchdata.nodes, the maintained successor of DataPipes, over the original image files.

    SamplerWrapper(the epoch plan's order) -> Batcher(batch_size, drop_last)
      -> ParallelMapper(load a batch, n_workers, process or thread)
      -> PinMemory (CUDA) -> Prefetcher -> Loader

Batches of sample indices are formed first and each worker loads a whole batch, so one message
per batch crosses between processes, as with DataLoader workers; mapping single samples would send
one per image. Workers are processes by default (`loader.method=thread` for threads: PIL and
torchvision.io release the GIL while decoding). decoder=torchvision decodes with torchvision.io
into uint8 batches, which the device crops and normalizes whole (facebench.run.finish); decoder=pil
runs the article's PIL transform per sample.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchdata.nodes import (
    Batcher,
    Loader,
    Mapper,
    ParallelMapper,
    PinMemory,
    Prefetcher,
    SamplerWrapper,
)
from torchdata.nodes.exception_wrapper import StartupExceptionWrapper

from facebench.config import Decoder, LoaderConfig, Workers
from facebench.data.records import Record
from facebench.errors import LoaderFailure
from facebench.loaders import shared
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.failures import (
    out_of_descriptors,
    signal_name,
    too_many_open_files,
    worker_died,
)
from facebench.loaders.plan import EpochPlan, batch_rng
from facebench.loaders.shared import (
    Batch,
    LoaderContext,
    PlanSampler,
)
from facebench.loaders.spec import LoaderSpec, decoder_traits

log = logging.getLogger(__name__)
_WATCH_PERIOD_S = 0.2


@dataclass
class Options(LoaderConfig):
    # process (default) or thread workers for ParallelMapper.
    method: Workers = Workers.process
    # torchvision: torchvision.io + batched tensor transforms; pil: the article's PIL transform.
    decoder: Decoder = Decoder.torchvision


class ToRecords:
    """Sample indices -> (index, record) pairs, in the main process: workers then get only the
    records of their batch, not the whole list."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    def __call__(self, indices: list[int]) -> list[tuple[int, Record]]:
        return [(i, self.records[i]) for i in indices]


class LoadBatch:
    """(index, record) pairs -> one Batch; picklable for process workers, which hand it over
    in shared memory (`shared.in_shared_memory`: a failure there reaches the loop)."""

    def __init__(self, stage: DecodeStage, plan: EpochPlan, in_process: bool = False) -> None:
        self.stage = stage
        self.plan = plan
        self.in_process = in_process

    def __call__(self, batch: list[tuple[int, Record]]) -> Batch:
        if self.stage.normalized:
            # The article's RandomCrop draws from torch's global generator, which forked
            # workers share: each batch gets its own seed, from the plan.
            ids = torch.tensor([i for i, _ in batch])
            torch.manual_seed(int(batch_rng(self.plan.seed, ids).integers(2**62)))
        made = self.stage.load(batch)
        return shared.in_shared_memory(made) if self.in_process else made


def worker_memory(ctx: LoaderContext) -> int:
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    options: Options = ctx.options
    plan = ctx.plan
    node = SamplerWrapper(PlanSampler(plan))  # this rank's share of the epoch's order
    node = Batcher(node, batch_size=ctx.batch_size, drop_last=True)
    node = Mapper(node, map_fn=ToRecords(ctx.records))
    in_process = ctx.n_workers > 0 and options.method == Workers.process
    load = LoadBatch(DecodeStage.of(ctx), plan, in_process)
    if ctx.n_workers > 0:
        node = ParallelMapper(
            node, map_fn=load, num_workers=ctx.n_workers, method=options.method, in_order=True
        )
    else:
        node = Mapper(node, map_fn=load)
    mapper = node
    if ctx.pin_memory:
        node = PinMemory(node)
    node = Prefetcher(node, prefetch_factor=ctx.options.prefetch_factor)
    return Watched(Loader(node), mapper) if ctx.n_workers > 0 else Loader(node)


# The threads that collect workers' batches (one per ParallelMapper iterator), and where their
# errors go instead of a traceback on stderr: the watch reports them as one line while the epoch
# runs. They can also fail after it ended (a failed epoch's workers are stopped while batches
# are still in flight, so receiving one fails), when there is nothing left to report.
_quiet_threads: weakref.WeakKeyDictionary[threading.Thread, dict] = weakref.WeakKeyDictionary()


def _quiet_thread_errors() -> None:
    """Route the errors of the threads in _quiet_threads to their Watched (installed once)."""
    previous = threading.excepthook
    if getattr(previous, "facebench_nodes", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        errors = _quiet_threads.get(args.thread) if args.thread is not None else None
        if errors is None:
            previous(args)
            return
        errors[args.thread] = args.exc_value
        log.debug("torchdata.nodes thread %s failed: %r", args.thread.name, args.exc_value)

    hook.facebench_nodes = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class Watched:
    """A nodes Loader whose ParallelMapper is watched while it is iterated.

    ParallelMapper waits forever for a batch from a worker process that died (the kernel's
    out-of-memory killer, say), and for every batch once the thread that puts its workers' results
    in order has died (it does when receiving a batch fails, e.g. with no file descriptor left).
    A thread here checks both a few times a second and, on either, hands the loop a LoaderFailure
    through the mapper's own output queue, so the run ends at once with one line instead of
    hanging. It reads the mapper's private attributes (torchdata 0.11, pinned).
    """

    def __init__(self, loader: Loader, mapper: ParallelMapper, loader_name: str = "nodes") -> None:
        self.loader = loader
        self.mapper = mapper
        self.loader_name = loader_name
        self._thread_errors: dict[threading.Thread, BaseException] = {}
        _quiet_thread_errors()

    def __iter__(self) -> Iterator:
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(stop,), name="facebench-nodes-watch", daemon=True
        )
        try:
            batches = iter(self.loader)
            mapper = self._mapper_iter()
            if mapper is not None:
                _quiet_threads[mapper._sort_thread] = self._thread_errors
            watcher.start()
            yield from batches
        finally:
            stop.set()
            if watcher.is_alive():
                watcher.join()
            self._drop_unsent()
            self._shut_down()

    def _drop_unsent(self) -> None:
        """Let the process exit without sending what the workers will never read.

        An epoch stopped early (max_batches, a time limit, an error) leaves work in the mapper's
        multiprocessing queues; at exit, each queue's feeder thread would wait forever to push
        it into a pipe nobody reads any more (a run measured its epoch, then never ended).
        """
        mapper = self._mapper_iter()
        for name in ("_in_q", "_intermed_q"):
            queue = getattr(mapper, name, None)
            if hasattr(queue, "cancel_join_thread"):  # process workers; thread queues need none
                queue.cancel_join_thread()

    def _shut_down(self) -> None:
        """Stop the mapper's threads and workers now, and collect what is left of this epoch's
        pipeline here. Left to the garbage collector, its iterator was copied into the workers
        the next epoch forks, and its finalizer ran there, failing on processes that are not
        the copy's children (an "Exception ignored" traceback from each worker)."""
        mapper = self._mapper_iter()
        if mapper is not None:
            mapper._shutdown()
        self.loader = self.mapper = None
        gc.collect()

    def _mapper_iter(self) -> Any:
        """The running _ParallelMapperIter (ParallelMapper -> _ParallelMapperImpl -> iter)."""
        return getattr(getattr(self.mapper, "_it", None), "_it", None)

    def _watch(self, stop: threading.Event) -> None:
        while not stop.wait(_WATCH_PERIOD_S):
            mapper = self._mapper_iter()
            if mapper is None or mapper._stop.is_set():
                continue
            failure = self._failure(mapper)
            if failure is not None:
                try:
                    raise failure
                except LoaderFailure:
                    wrapped = StartupExceptionWrapper(where="in facebench's watch of the workers")
                mapper._out_q.put((wrapped, -1))
                return

    def _failure(self, mapper: Any) -> LoaderFailure | None:
        for worker in mapper._workers:
            code = getattr(worker, "exitcode", None)  # processes; threads end only when stopped
            if code not in (None, 0):
                return worker_died(self.loader_name, worker.pid, signal_name(code))
        sort_thread = mapper._sort_thread
        if mapper.in_order and sort_thread.ident is not None and not sort_thread.is_alive():
            error = self._thread_errors.get(sort_thread)
            if error is not None and out_of_descriptors(error):
                return too_many_open_files(self.loader_name)
            return LoaderFailure(
                f"loader={self.loader_name}: the thread that collects the workers' batches "
                f"stopped ({error!r}); run with n_workers=0 to see the error in this process"
            )
        return None


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    # ParallelMapper keeps 2 x num_workers batches in flight (torchdata 0.11, no
    # max_concurrent), whatever prefetch_factor says; its Prefetcher holds prefetch_factor more.
    ready_per_worker=lambda options: 2,
    received_ahead=lambda options: options.prefetch_factor,
    bucket_refusal=None,
)
