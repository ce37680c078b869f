"""A new loader is one module (and one YAML file, or a registration): the suite picks it up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from facebench.paths import PROJECT_ROOT


@pytest.mark.slow
def test_a_registered_loader_joins_the_loader_tests_unedited():
    command = [sys.executable, "-m", "pytest", "-p", "tests.throwaway_loader", "-q"]
    collected = subprocess.run(
        [*command, "--collect-only", "tests/test_loaders.py", "tests/test_folder.py"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    ids = set(collected.stdout.splitlines())
    # Every test parametrized over the loaders (those with a [raw] case) has a throwaway case.
    over_loaders = {test for test in ids if "[raw]" in test or "-raw]" in test}
    assert len(over_loaders) >= 5, collected.stdout[-3000:]
    for test in over_loaders:
        assert test.replace("raw]", "throwaway]") in ids, test
    ran = subprocess.run(
        [*command, "-p", "no:cacheprovider", "-k", "throwaway", "tests/test_loaders.py"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-3000:]
    assert "passed" in ran.stdout.splitlines()[-1]
