"""A user's own pipeline, measured as a loader (facebench/loaders/custom.py): their Dataset,
IterableDataset, DataLoader or iterable of batches, built from its Hydra `_target_`
(target.py), timed inside its workers without a line of it changed (probes.py), its batches
carried to the loop with what was measured of them (carrier.py), and what facebench can and
cannot check of it said (checks.py).

May import: errors, stages, host.
"""
