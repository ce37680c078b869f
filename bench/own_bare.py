"""The example pipeline (shopdata.py) in a DataLoader that facebench does not look inside: an
iterable of batches, for bench/own_pipeline.py's measure of what its probes cost."""

from collections.abc import Iterator

from shopdata import shop_images
from torch.utils.data import DataLoader


class Bare:
    def __init__(self, root: str, batch_size: int = 256, num_workers: int = 2) -> None:
        self.loader = DataLoader(
            shop_images(root),
            batch_size=batch_size,
            shuffle=True,
            num_workers=num_workers,
            drop_last=True,
        )

    def __iter__(self) -> Iterator:
        return iter(self.loader)
