"""data=folder: any class-folder data set (or a labels CSV), read alike by every loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from facebench import loaders
from facebench.data.folder import csv_records, folder_records
from facebench.data.sources import Layout, read_records
from facebench.data.synthetic import ensure_synthetic
from facebench.data.transforms import Geometry
from facebench.errors import ConfigError, DataError
from facebench.run.runner import run_training
from facebench.shards.manifest import Manifest
from tests.helpers import (
    CLOSE,
    LOADERS,
    TOLERANCE,
    assert_same_samples,
    context,
    delivered,
    expected,
    prepared,
)

FOLDER = Layout("folder")


def _image(path: Path, size=(30, 20), mode="RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, 128).save(path)


@pytest.fixture(scope="module")
def folder_root(cache: Path) -> Path:
    # Mixed sizes (wide, tall, square), modes (RGB, RGBA, grey, palette), formats (JPEG,
    # progressive JPEG, PNG, WebP), extensions in mixed case, nested folders, non-image files.
    return ensure_synthetic(cache, n_images=120, seed=0, n_procs=1, layout="folder")


def test_class_folders_are_sorted_nested_files_belong_to_their_top_folder(tmp_path):
    _image(tmp_path / "zebra" / "a.JPG")
    _image(tmp_path / "ant eater" / "deep" / "er" / "b.png")
    _image(tmp_path / "éclair" / "c.WebP", mode="L")
    (tmp_path / "zebra" / "notes.txt").write_text("not an image")
    _image(tmp_path / "stray.png")  # in no class folder
    records, labels = folder_records(tmp_path)
    assert labels.classes == ("ant eater", "zebra", "éclair")  # sorted, as ImageFolder sorts
    assert [(Path(r.path).name, r.label) for r in records] == [
        ("b.png", 0),
        ("a.JPG", 1),
        ("c.WebP", 2),
    ]
    assert labels.class_map() == {"ant eater": 0, "zebra": 1, "éclair": 2}


def test_a_labels_csv_gives_integer_or_named_classes(tmp_path):
    for name in ("x/1.png", "x/2.png", "y/3.png"):
        _image(tmp_path / name)
    (tmp_path / "ints.csv").write_text("path,label\nx/1.png,2\nx/2.png,0\ny/3.png,2\n")
    records, labels = csv_records(tmp_path, "ints.csv")
    assert [r.label for r in records] == [2, 0, 2] and labels.n_classes == 3
    (tmp_path / "names.csv").write_text("x/1.png,dog\r\nx/2.png,cat\r\n\ny/3.png,dog")
    records, labels = csv_records(tmp_path, str(tmp_path / "names.csv"))
    assert [r.label for r in records] == [1, 0, 1] and labels.classes == ("cat", "dog")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("x/1.png\n", "labels.csv:1: expected 'path,label'"),
        ("x/1.png,a\n../outside.png,b\n", "labels.csv:2: ../outside.png is not inside"),
        ("x/1.png,a\nx/1.png,b\n", "labels.csv:2: x/1.png is listed again (first on line 1)"),
        ("x/1.png,-1\n", "labels.csv:1: label -1 must be 0 or more"),
        # Classes are counted up to the largest label: this one would count a billion.
        ("x/1.png,3\nx/2.png,999999999\n", "labels.csv:2: label 999999999 is too large"),
        # Labels that int() refuses or reads otherwise than they look, among integer ones.
        ("x/1.png,3\nx/2.png,\u00b2\n", "labels.csv:2: label '\u00b2' looks like a number but"),
        ("x/1.png,3\nx/2.png,--1\n", "labels.csv:2: label '--1' looks like a number but"),
        ("x/1.png,3\nx/2.png,+1\n", "labels.csv:2: label '+1' looks like a number but"),
        ("x/1.png,3\nx/2.png,1.0\n", "labels.csv:2: label '1.0' looks like a number but"),
        ("x/1.png,cat\nx/2.png,\u0663\n", "labels.csv:2: label '\u0663' looks like a number"),
        ("x/1.png,3\nx/2.png,dog\n", "labels.csv:2: label 'dog' is a name, but line 1's is an"),
        ("x/1.png,dog\nx/2.png,3\n", "labels.csv:2: label '3' is an integer, but line 1's is a"),
        ("x/1.png,d\x07g\n", "labels.csv:1: label 'd\\x07g' holds control characters"),
        # Paths that are no image file.
        ("x,1\n", "labels.csv:1: x is a folder, not an image file"),
        ("x/1.png,1\n.,2\n", "labels.csv:2: . is a folder, not an image file"),
        (",1\n", "labels.csv:1: expected 'path,label'"),
        pytest.param(
            f"{'n' * 300}.png,1\n",
            "labels.csv:1: " + "n" * 300 + ".png cannot be used (File name too long)",
            id="a-name-too-long",
        ),
        ("x/1.png,1\nx/./1.png,2\n", "labels.csv:2: x/./1.png is listed again (first on line 1)"),
        ("x/1.png,1\nx/2.png,1\x00\n", "labels.csv:2: label '1\\x00' holds control characters"),
        pytest.param(
            f"x/1.png,1\nx/2.png,{'9' * 200_000}\n",
            "labels.csv:2: not a CSV row (field larger",
            id="a-field-over-csv-limit",
        ),
        ("path,label\n", "no 'path,label' rows"),
    ],
)
def test_a_bad_labels_csv_is_named_with_its_line(tmp_path, text, says):
    _image(tmp_path / "x" / "1.png")
    _image(tmp_path / "x" / "2.png")
    (tmp_path / "labels.csv").write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as error:
        csv_records(tmp_path, "labels.csv")
    assert says in str(error.value)
    assert "\n" not in str(error.value)


def test_a_labels_csv_reads_quoted_names_and_a_labels_folder_is_named(tmp_path):
    _image(tmp_path / "x" / "a, b.png")
    (tmp_path / "labels.csv").write_text('"x/a, b.png","a class, with a comma"\n')
    records, labels = csv_records(tmp_path, "labels.csv")
    assert records[0].path.endswith("a, b.png") and labels.classes == ("a class, with a comma",)
    with pytest.raises(DataError, match="data.labels=.*x: cannot be read"):
        csv_records(tmp_path, "x")


def test_a_folder_without_class_folders_says_what_it_expects(tmp_path):
    _image(tmp_path / "loose.jpg")
    with pytest.raises(DataError, match="no class folders"):
        folder_records(tmp_path)


def test_the_generated_folder_set_mixes_sizes_modes_and_formats(folder_root):
    records, labels = read_records(folder_root, FOLDER)
    assert len(records) == 120 and labels.n_classes == 3
    sizes, modes = set(), set()
    for record in records:
        with Image.open(record.path) as image:
            sizes.add(image.size)
            modes.add(image.mode)
    assert len(sizes) >= 6 and {"RGB", "RGBA", "L", "P"} <= modes
    assert {Path(r.path).suffix for r in records} >= {".jpg", ".JPEG", ".Png", ".webp"}
    assert any(Path(r.path).parent.name == "more" for r in records)  # nested in its class


@pytest.mark.parametrize("name", LOADERS)
def test_every_loader_reads_a_folder_set_once_with_the_same_pixels(make_cfg, folder_root, name):
    cfg = make_cfg(
        "data=synthetic",
        "data.layout=folder",
        f"loader={name}",
        "loader.crop=center",
        "shard_size=32",
        "n_workers=2",
        "batch_size=4",
    )
    spec, ctx = prepared(cfg, folder_root)
    seen = delivered(spec.build(ctx))
    truth = expected(folder_root, FOLDER)
    assert len(seen) >= 120 - 2 * 3  # one partial batch per worker, where workers batch
    assert_same_samples(seen, truth, atol=TOLERANCE if name in CLOSE else 1e-5)
    if spec.shard_format:
        manifest = Manifest.read(ctx.shards_dir)
        assert manifest.classes == list(ctx.labels.classes)  # the class map travels with shards


@pytest.mark.parametrize("name", ["dataset", "datapipe", "pickle"])
def test_a_run_over_a_labels_csv_records_its_class_map(make_cfg, tmp_path, folder_root, name):
    records, _ = read_records(folder_root, FOLDER)
    rows = [f'"{Path(r.path).relative_to(folder_root)}",kind{r.label % 2}' for r in records]
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n" + "\n".join(rows) + "\n")
    cfg = make_cfg(
        "data=folder",
        f"data.root={folder_root}",
        f"data.labels={csv}",
        f"loader={name}",
        "n_workers=2",
        "batch_size=4",
        f"shards_dir={tmp_path / 'shards'}",
    )
    metrics = run_training(cfg, output_dir=tmp_path)  # the exactly-once check runs inside
    assert metrics["samples_unique"] == metrics["samples_seen"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["classes"] == {"kind0": 0, "kind1": 1}


# Another geometry than the article's: smaller, a crop of most of it, other statistics.
SMALL = [
    "transform.resize=64",
    "transform.crop=48",
    "transform.mean=[0.5,0.4,0.3]",
    "transform.std=[0.25,0.2,0.3]",
]


@pytest.mark.parametrize("name", LOADERS)
def test_every_loader_follows_the_configured_geometry(make_cfg, tmp_path, folder_root, name):
    cfg = make_cfg(
        "data=synthetic",
        "data.layout=folder",
        f"loader={name}",
        "loader.crop=center",
        "n_workers=2",
        "batch_size=4",
        "shard_size=40",
        f"shards_dir={tmp_path}",
        *SMALL,
    )
    spec, ctx = loaders.get(name), context(cfg, folder_root)
    assert ctx.geometry == Geometry(64, 48, (0.5, 0.4, 0.3), (0.25, 0.2, 0.3))
    spec.set_up_job(ctx)
    seen = delivered(spec.build(ctx), geometry=ctx.geometry)
    assert all(image.shape == (3, 48, 48) for image, _ in seen.values())
    truth = expected(folder_root, FOLDER, ctx.geometry)
    assert_same_samples(seen, truth, atol=TOLERANCE * 0.225 / 0.2 if name in CLOSE else 1e-5)


def test_raw_shards_follow_transform_resize(make_cfg, tmp_path, folder_root):
    def build(*overrides):
        cfg = make_cfg(
            "data=synthetic",
            "data.layout=folder",
            "loader=raw",
            f"shards_dir={tmp_path}",
            *overrides,
        )
        spec, ctx = prepared(cfg, folder_root)
        return Manifest.read(ctx.shards_dir)

    assert build().settings["resize"] == 112
    small = build("transform.resize=64", "transform.crop=48")  # rebuilt: the records are smaller
    assert small.settings["resize"] == 64
    assert small.shards[0].bytes < build().shards[0].bytes


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("transform.crop=120", "transform.crop=120: must be from 1 to transform.resize (112)"),
        ("transform.mean=[0.5]", "transform.mean=[0.5]: give one value per channel"),
        ("transform.std=[0.2,0,0.2]", "every value must be above 0"),
        ("transform.std=[nan,1,1]", "transform.std=[nan, 1.0, 1.0]: every value must be a finite"),
        ("transform.mean=[0.5,inf,0.5]", "every value must be a finite number"),
    ],
)
def test_a_bad_geometry_is_named(make_cfg, override, says):
    with pytest.raises(ConfigError) as error:
        make_cfg(override)
    assert says in str(error.value)
