"""A DDP training script as users write one, its loader watched: run by torchrun, two ranks
(gloo, CPU), for tests/test_watch.py. argv: the folder for rank 0's results.json."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from facebench import watch

dist.init_process_group("gloo")
images = torch.randn(64, 3, 8, 8)
labels = torch.arange(64) % 4
dataset = TensorDataset(images, labels)
loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset), num_workers=1)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(192, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch_images, batch_labels in watch(loader, folder=sys.argv[1], tracking=False):
    loss = nn.functional.cross_entropy(model(batch_images), batch_labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
