"""Generate a synthetic set (once) and print where it is, without recording a benchmark run.

    python -m facebench.generate                            # the default: 6,000 faces
    python -m facebench.generate --layout folder --n-images 10000
    python train.py data=folder data.root=$(python -m facebench.generate --layout folder)

The set is the one `data=synthetic` with the same data.n_images, data.seed and data.layout reads
(in data.cache_dir, .cache/ by default); an existing one is reused. Progress goes to stderr, the
folder alone to stdout.
"""

from __future__ import annotations

import argparse
import logging
import sys

from facebench.config import DataConfig, DataLayout
from facebench.data.synthetic import ensure_synthetic
from facebench.errors import FacebenchError
from facebench.host.paths import cache_dir

DEFAULT_IMAGES = 6000  # conf/data/synthetic.yaml's data.n_images


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m facebench.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n-images", type=int, default=DEFAULT_IMAGES, help="data.n_images")
    parser.add_argument("--seed", type=int, default=DataConfig.seed, help="data.seed")
    parser.add_argument(
        "--layout",
        choices=[layout.value for layout in DataLayout],
        default=DataLayout.faces.value,
        help="data.layout: faces (CelebA/, DigiFace1M/) or folder (one folder per class)",
    )
    parser.add_argument("--cache-dir", default="", help="data.cache_dir (default: .cache/)")
    parser.add_argument("--n-procs", type=int, default=0, help="processes (default: the cores)")
    args = parser.parse_args(argv)
    if args.n_images < 1:
        parser.error(f"--n-images {args.n_images}: give 1 or more")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        root = ensure_synthetic(
            cache_dir(args.cache_dir), args.n_images, args.seed, args.n_procs, args.layout
        )
    except FacebenchError as error:
        raise SystemExit(str(error)) from None
    print(root)


if __name__ == "__main__":
    main()
