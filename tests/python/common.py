"""The model and data the Python tests share (worker and reference)."""

import torch

FEATURES, CLASSES, GLOBAL_BATCH, BATCHES = 16, 4, 16, 6


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, CLASSES))


def data():
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(BATCHES, GLOBAL_BATCH, FEATURES, generator=g)
    ys = torch.randint(0, CLASSES, (BATCHES, GLOBAL_BATCH), generator=g)
    return xs, ys
