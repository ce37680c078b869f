"""Reading CelebA and DigiFace1M from their real layouts, and the label space they share."""

from __future__ import annotations

import pytest

from facebench.data.sources import (
    CELEBA,
    DIGIFACE,
    celeba_identities,
    list_digiface,
    read_records,
)
from facebench.errors import DataError


def test_labels_follow_the_documented_scheme(tree_factory):
    root = tree_factory(
        celeba={"000001.jpg": 3, "000002.jpg": 1, "000003.jpg": 3},
        digiface={0: 2, 2: 1},
    )
    records, labels = read_records(root)
    assert labels.n_celeba == 3 and labels.n_digiface == 3 and labels.n_classes == 6
    by_name = {
        (r.source, r.path.split("/")[-2] + "/" + r.path.split("/")[-1]): r.label for r in records
    }
    assert by_name[(CELEBA, "img_align_celeba/000001.jpg")] == 2
    assert by_name[(CELEBA, "img_align_celeba/000002.jpg")] == 0
    assert by_name[(DIGIFACE, "0/0.png")] == 3
    assert by_name[(DIGIFACE, "0/1.png")] == 3
    assert by_name[(DIGIFACE, "2/0.png")] == 5
    assert len(records) == 6


def test_largest_celeba_identity_and_first_digiface_folder_do_not_collide(tree_factory):
    # The seed labelled both of these 10177.
    root = tree_factory(celeba={"000001.jpg": 10177}, digiface={0: 1})
    records, labels = read_records(root)
    celeba_label = next(r.label for r in records if r.source == CELEBA)
    digiface_label = next(r.label for r in records if r.source == DIGIFACE)
    assert celeba_label == 10176
    assert digiface_label == 10177
    assert labels.n_classes == 10178


@pytest.mark.parametrize(
    "text",
    [
        "000001.jpg 5\r\n000002.jpg 7\r\n",  # Windows line ends
        "000001.jpg 5   \n000002.jpg 7\t\n",  # trailing spaces and tabs
        "\n000001.jpg 5\n\n   \n000002.jpg 7\n\n",  # blank lines
        "000001.jpg 5\n000002.jpg 7",  # no final newline
        "000001.jpg   5\n000002.jpg\t7\n",  # more than one space between fields
        "\ufeff000001.jpg 5\n000002.jpg 7\n",  # a UTF-8 byte-order mark
    ],
)
def test_odd_but_valid_label_files_read_the_same(tree_factory, text):
    root = tree_factory(celeba={"000001.jpg": 5, "000002.jpg": 7}, digiface={}, label_text=text)
    assert celeba_identities(root) == [("000001.jpg", 5), ("000002.jpg", 7)]


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("000001.jpg 5\n000002.jpg\n", 2, "expected '<image name> <identity>'"),
        ("000001.jpg 5 9\n", 1, "expected '<image name> <identity>'"),
        ("000001.jpg 5\n\n000002.jpg five\n", 3, "not an integer"),
        ("000001.jpg 0\n", 1, "must be 1 or more"),
        ("../../etc/passwd 4\n", 1, "plain file name"),
        ("000001.jpg 5\n000002.jpg 6\n000001.jpg 7\n", 3, "listed again (first on line 1)"),
    ],
)
def test_malformed_label_lines_name_the_file_and_line(tree_factory, text, line, says):
    root = tree_factory(celeba={"000001.jpg": 5}, digiface={}, label_text=text)
    with pytest.raises(DataError) as error:
        celeba_identities(root)
    message = str(error.value)
    assert f"identity_CelebA.txt:{line}:" in message
    assert says in message


def test_missing_pieces_are_named(tmp_path, tree_factory):
    with pytest.raises(DataError, match="data.root not found"):
        read_records(tmp_path / "nowhere")
    root = tree_factory(celeba={"000001.jpg": 1}, digiface={0: 1})
    (root / "CelebA" / "identity_CelebA.txt").unlink()
    with pytest.raises(DataError, match="identity_CelebA.txt: CelebA label file not found"):
        read_records(root)


def test_digiface_ignores_non_png_files_and_counts_them(tree_factory):
    root = tree_factory(celeba={"000001.jpg": 1}, digiface={4: 3})
    (root / "DigiFace1M" / "4" / "notes.txt").write_text("not an image")
    (root / "DigiFace1M" / "4" / "Thumbs.db").write_bytes(b"\0")
    listing = list_digiface(root)
    assert len(listing.files) == 3
    assert listing.ignored == 2
    assert all(path.endswith(".png") for _, path in listing.files)


def test_digiface_folder_that_is_not_an_identity_is_an_error(tree_factory):
    root = tree_factory(celeba={"000001.jpg": 1}, digiface={0: 1})
    (root / "DigiFace1M" / "extras").mkdir()
    with pytest.raises(DataError, match="extras: DigiFace1M folder names are integer"):
        read_records(root)


def test_a_label_file_that_is_not_text_is_named(tree_factory):
    root = tree_factory(celeba={"000001.jpg": 1}, digiface={}, label_text="")
    (root / "CelebA" / "identity_CelebA.txt").write_bytes(b"000001.jpg 1\n\xff\xfe\x00garbage")
    with pytest.raises(DataError, match="identity_CelebA.txt: not UTF-8 text"):
        celeba_identities(root)


def test_an_identity_or_folder_number_far_above_the_data_is_named(tree_factory):
    # Classes are counted up to the largest identity and folder: these would count a billion.
    root = tree_factory(
        celeba={"000001.jpg": 3, "000002.jpg": 1},
        digiface={0: 1},
        label_text="000001.jpg 3\n\n000002.jpg 999999999\n",
    )
    with pytest.raises(DataError, match=r"identity_CelebA.txt:3: identity 999999999 is too large"):
        read_records(root)
    root = tree_factory(celeba={"000001.jpg": 3}, digiface={0: 1, 999999999: 1})
    with pytest.raises(DataError, match=r"DigiFace1M/999999999: DigiFace1M folder 999999999 is"):
        read_records(root)
