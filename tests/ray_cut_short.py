"""Run by tests/test_raydata.py in a process of its own: an epoch of Ray Data cut short, as
`max_batches` cuts one, then `end_threads` as the job's end calls it before Ray's shutdown.

Prints the Ray Data threads alive after the cut (there must be some, or the check proves
nothing), then those still alive after end_threads (there must be none); exits 0 once Ray is
shut down.
"""

from __future__ import annotations

import time

import numpy as np
import ray

from facebench.loaders.ray_cluster import ray_cluster
from facebench.loaders.ray_threads import end_threads, ray_data_threads


def slow(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(0.05)  # tasks still running when the epoch stops
    return rows


def main() -> None:
    with ray_cluster("", 2, 256 * 2**20):
        dataset = ray.data.range(2_000, override_num_blocks=100).map_batches(slow, batch_size=20)
        batches = iter(dataset.iter_batches(batch_size=20, prefetch_batches=4))
        for _ in range(3):
            next(batches)
        del batches  # as the epoch loop drops its iterator
        print("after the cut:", sorted(thread.name for thread in ray_data_threads()), flush=True)
        left = end_threads()
        print("after end_threads:", sorted(thread.name for thread in ray_data_threads()), left)
    print("shut down", flush=True)


if __name__ == "__main__":
    main()
