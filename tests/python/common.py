"""The model and data the Python tests share (worker and reference)."""

import torch

FEATURES, CLASSES, GLOBAL_BATCH, BATCHES = 16, 4, 16, 6


def make_model(tied=False):
    torch.manual_seed(0)
    if not tied:
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, CLASSES))
    m = torch.nn.Sequential(torch.nn.Linear(FEATURES, FEATURES), torch.nn.Tanh(),
                            torch.nn.Linear(FEATURES, FEATURES), torch.nn.ReLU(),
                            torch.nn.Linear(FEATURES, CLASSES))
    m[2].weight = m[0].weight  # tied weights: one parameter in two modules
    return m


def data():
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(BATCHES, GLOBAL_BATCH, FEATURES, generator=g)
    ys = torch.randint(0, CLASSES, (BATCHES, GLOBAL_BATCH), generator=g)
    return xs, ys
