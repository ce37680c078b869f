"""A user's own pipeline measured as a loader (loader=custom): their Dataset, IterableDataset,
DataLoader or iterable of batches, built from its Hydra `_target_` (target.py), timed inside
its workers without a line of it changed (probes.py), its batches counted (batches.py), and
what facebench can and cannot check of it said (checks.py).

May import: stages, errors, host, loaders.shared (the Batch it hands the loop).
"""
