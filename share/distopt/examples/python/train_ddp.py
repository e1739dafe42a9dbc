#!/usr/bin/env python3
"""The quickstart's MLP on Fashion-MNIST with PyTorch's own
DistributedDataParallel, over distopt's communicators: a script written for
gloo, with `import distopt` and the backend's name changed. Run it on 2
local ranks (torchrun works the same way):

    PYTHONPATH=build/python distopt launch -n 2 -- python3 train_ddp.py [--backend gloo]
        [--zero]   # PyTorch's ZeroRedundancyOptimizer over the same backend

DDP reduces the gradients bucket by bucket during backward through
dist.all_reduce on the "distopt" process group (the tcp communicator: shared
memory between ranks on one host). Prints the test accuracy after each
epoch (rank 0).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import distopt  # noqa: F401  registers the "distopt" backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_mlp import load  # noqa: E402  (the same Fashion-MNIST reader)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="distopt", help="distopt (default) or gloo, to compare")
    ap.add_argument("--zero", action="store_true", help="torch.distributed.optim.ZeroRedundancyOptimizer")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128, help="per rank")
    ap.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0 = all)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()

    dist.init_process_group(a.backend)  # env:// from the launcher (RANK, MASTER_ADDR, ...)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                              nn.ReLU(), nn.Linear(256, 10)))
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_x, train_y = load(a.data, "train")
    test_x, test_y = load(a.data, "t10k")
    global_batch = a.batch * world
    steps = len(train_y) // global_batch
    if a.max_steps:
        steps = min(steps, a.max_steps)
    for epoch in range(1, a.epochs + 1):
        model.train()
        perm = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(epoch))  # same on every rank
        for step in range(steps):
            idx = perm[step * global_batch + rank * a.batch:step * global_batch + (rank + 1) * a.batch]
            opt.zero_grad()
            F.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            opt.step()
        model.eval()
        lo, hi = len(test_y) * rank // world, len(test_y) * (rank + 1) // world
        with torch.no_grad():
            correct = (model(test_x[lo:hi]).argmax(1) == test_y[lo:hi]).sum().item()
        counts = torch.tensor([float(correct), float(hi - lo)], dtype=torch.float64)
        dist.all_reduce(counts)
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {100 * counts[0].item() / counts[1].item():.2f}% "
                  f"(DDP over {a.backend}{', ZeroRedundancyOptimizer' if a.zero else ''}, {world} ranks)",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
