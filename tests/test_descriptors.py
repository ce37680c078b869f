"""How many descriptors a process has left: counted as the kernel hands them out."""

from __future__ import annotations

import subprocess
import sys

# In a process of its own: a limit lowered here would be this pytest worker's. For each limit,
# what descriptors_left says, then how many descriptors the kernel opens before EMFILE.
_CHECK = """
import errno, os, resource
from facebench.loaders.failures import descriptors_left
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
lowest_free = os.open(os.devnull, os.O_RDONLY)  # a new descriptor takes the lowest free number
os.close(lowest_free)
for extra in (3, 1, 0):
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free + extra, hard))
    left, taken = descriptors_left(), []
    try:
        while len(taken) < 100:
            taken.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as error:
        assert error.errno == errno.EMFILE, error
    print(left, len(taken))
    for fd in taken:
        os.close(fd)
"""


def test_descriptors_left_is_what_the_kernel_still_opens():
    run = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    pairs = [tuple(map(int, line.split())) for line in run.stdout.strip().splitlines()]
    assert len(pairs) == 3 and all(left == opened for left, opened in pairs), run.stdout
    # Room above the lowest free number, then none at all (every number below the limit held).
    assert pairs[0][0] >= 1 and pairs[2] == (0, 0), run.stdout
