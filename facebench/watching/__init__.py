"""A user's own training loop, measured where it runs: `watch(loader)` hands every batch through
unchanged and measures the loop as train.py measures its own (session.py, epoch.py), reaches
inside a DataLoader's workers with loader=custom's probes (reach.py), reads the GPU's wait for
data from CUDA events (gpu_wait.py), tells how the loop ended (ending.py), pools ranks (ranks.py),
says what it found (summary.py) and records the run (record.py).

May import: errors, stages, results, host, custom, measure, tracking, run.
"""

from facebench.watching.session import Watch, watch

__all__ = ["Watch", "watch"]
