"""A new loader is one module (and one YAML file, or a registration): the suite picks it up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from facebench.host.paths import PROJECT_ROOT


@pytest.mark.slow
def test_a_registered_loader_joins_the_loader_tests_unedited():
    # One process (-n 0): what it collects and runs is read from its output.
    command = [sys.executable, "-m", "pytest", "-n", "0", "-p", "tests.throwaway_loader", "-q"]
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


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["loader=dataset"], "dataset-w0-bs8-loader-only"),  # pil: its default
        (["loader=dataset", "loader.decoder=fast"], "dataset-fast-w0-bs8-loader-only"),
        (["loader=nodes", "loader.decoder=pil"], "nodes-pil-w0-bs8-loader-only"),
        (["loader=nodes", "loader.decoder=torchvision"], "nodes-w0-bs8-loader-only"),
        (["loader=spdl"], "spdl-w0-bs8-loader-only"),  # fast: its default
        (["loader=raw", "model=resnet50", "amp=off"], "raw-w0-bs8-fp32"),  # decodes nothing
        # A user's own pipeline: named by its target, whose runs would otherwise share a name.
        (["loader=custom", "loader.dataset._target_=m.Shop"], "custom-Shop-w0-bs8-loader-only"),
    ],
)
def test_a_runs_name_names_a_decoder_other_than_its_loaders_default(make_cfg, overrides, name):
    # Two runs that differ only in their decoder must not share a name; each loader's default
    # comes from its options schema in the registry.
    from facebench.run.job import run_name

    cfg = make_cfg(*overrides)
    precision = "fp32" if cfg.model != "none" else ""
    assert run_name(cfg, precision) == name
