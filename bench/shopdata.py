# shopdata.py
import torch
from torchvision import datasets
from torchvision.transforms import v2


def shop_images(root: str, crop: int = 100) -> datasets.ImageFolder:
    augment = v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(crop, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(0.4, 0.4, 0.4),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    return datasets.ImageFolder(root, transform=augment)
