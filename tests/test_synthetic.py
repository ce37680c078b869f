"""The synthetic stand-in: the real layout, realistic file sizes, deterministic, reused."""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from facebench.data.sources import read_records
from facebench.data.synthetic import ensure_synthetic


def _sizes(paths: list[str]) -> float:
    return sum(os.path.getsize(path) for path in paths) / len(paths)


def test_layout_split_and_identities(synthetic_root: Path):
    records, labels = read_records(synthetic_root)
    celeba = [r for r in records if r.source == "CelebA"]
    digiface = [r for r in records if r.source == "DigiFace1M"]
    assert len(records) == 120
    assert len(celeba) == round(0.22 * 120)
    # Several images per identity in both sources.
    assert len({r.label for r in celeba}) < len(celeba) / 2
    assert len({r.label for r in digiface}) < len(digiface) / 2
    with Image.open(celeba[0].path) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (178, 218))
    with Image.open(digiface[0].path) as image:
        assert (image.format, image.mode, image.size) == ("PNG", "RGBA", (112, 112))
    assert labels.n_classes == labels.n_celeba + labels.n_digiface


def test_files_cost_what_real_ones_cost(synthetic_root: Path):
    records, _ = read_records(synthetic_root)
    celeba_kb = _sizes([r.path for r in records if r.source == "CelebA"]) / 1024
    digiface_kb = _sizes([r.path for r in records if r.source == "DigiFace1M"]) / 1024
    assert 5 <= celeba_kb <= 9, celeba_kb
    assert 15 <= digiface_kb <= 25, digiface_kb


def test_deterministic_for_a_seed_and_reused(tmp_path: Path, synthetic_root: Path):
    again = ensure_synthetic(tmp_path, n_images=120, seed=0, n_procs=2)
    assert again != synthetic_root
    for name in (
        "CelebA/identity_CelebA.txt",
        "CelebA/img_align_celeba/000003.jpg",
        "DigiFace1M/1/5.png",
    ):
        assert (again / name).read_bytes() == (synthetic_root / name).read_bytes()
    stamp = (again / "DigiFace1M/1/5.png").stat().st_mtime_ns
    assert ensure_synthetic(tmp_path, n_images=120, seed=0) == again
    assert (again / "DigiFace1M/1/5.png").stat().st_mtime_ns == stamp
    other = ensure_synthetic(tmp_path, n_images=120, seed=1, n_procs=1)
    assert other != again
    assert (other / "DigiFace1M/1/5.png").read_bytes() != (
        again / "DigiFace1M/1/5.png"
    ).read_bytes()
