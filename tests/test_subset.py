"""advise's sample of a data set: a tree of links to n of its files, read back as the same
samples with the same labels, in either layout."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image

from facebench.data.sources import FACES, Layout, read_records
from facebench.data.subset import subset_tree


def _samples(root: Path, layout: Layout) -> set[tuple[str, int]]:
    records, _ = read_records(root, layout)
    return {(os.path.relpath(record.path, root), record.label) for record in records}


def test_a_faces_sample_links_n_files_with_their_labels(tree_factory, tmp_path):
    root = tree_factory(celeba={f"{i:06d}.jpg": 1 + i % 3 for i in range(1, 7)}, digiface={0: 3})
    sample = subset_tree(root, read_records(root)[0], 5, tmp_path / "cache", seed=1)
    chosen = _samples(sample, FACES)
    assert len(chosen) == 5 and {path for path, _ in chosen} <= {
        p for p, _ in _samples(root, FACES)
    }
    # CelebA's labels are its identities' (DigiFace's follow the largest identity drawn).
    celeba = {sample for sample in chosen if sample[0].startswith("CelebA")}
    assert celeba and celeba <= _samples(root, FACES)
    for path in sample.rglob("*.*g"):
        assert path.is_symlink() and path.resolve() == (root / path.relative_to(sample)).resolve()


def test_a_folder_sample_keeps_every_class_folder(tmp_path):
    root = tmp_path / "folder"
    for name in ("cat", "dog", "owl"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            buffer = io.BytesIO()
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(buffer, format="PNG")
            (root / name / f"{i}.png").write_bytes(buffer.getvalue())
    layout = Layout(kind="folder")
    records, labels = read_records(root, layout)
    sample = subset_tree(root, records, 2, tmp_path / "cache", layout=layout, labels=labels)
    assert sorted(path.name for path in sample.iterdir()) == ["cat", "dog", "owl"]
    chosen = _samples(sample, layout)
    assert len(chosen) == 2 and chosen <= _samples(root, layout)


def test_a_sample_follows_its_data_set_s_labels_and_names(tree_factory, tmp_path):
    """The same count of images, one identity changed in the labels file: the next sample
    carries the new label (links alone would follow new bytes, not a new label)."""
    celeba = {f"{i:06d}.jpg": 1 + i % 3 for i in range(1, 7)}
    root = tree_factory(celeba=celeba, digiface={0: 2})
    cache = tmp_path / "cache"
    before = subset_tree(root, read_records(root)[0], 7, cache, seed=1)
    labels = root / "CelebA" / "identity_CelebA.txt"
    lines = labels.read_text().splitlines()
    lines = [f"{line.split()[0]} 9" for line in lines]  # every image now of identity 9
    labels.write_text("\n".join(lines) + "\n")
    after = subset_tree(root, read_records(root)[0], 7, cache, seed=1)
    assert after != before
    celeba_labels = {label for path, label in _samples(after, FACES) if path.startswith("CelebA")}
    assert celeba_labels == {8}  # identity 9, 0-based
