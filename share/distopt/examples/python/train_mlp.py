#!/usr/bin/env python3
"""The quickstart's MLP on Fashion-MNIST, trained from a plain PyTorch loop
with one of distopt's optimizers. Run it on 2 local ranks:

    PYTHONPATH=build/python distopt launch -n 2 -- python3 train_mlp.py [--algorithm zero]

Each rank trains on its slice of every global batch; distopt reduces the
gradients during backward and runs the job's algorithm in opt.step().
--algorithm: allreduce (default), zero (optimizer state sharded; the
ZeroRedundancyOptimizer shape), zero3 (parameters sharded too, FSDP's full
sharding: each Linear layer a unit, gathered around its forward and
backward), fused, hybrid (Adam's update half on the CPU). --bf16 (with
allreduce or zero3): the model computes in bfloat16, the optimizer keeps
fp32 master weights (sharded with zero3) and scales the loss. Prints the
test accuracy after each epoch (rank 0).
"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import distopt


def idx(path):
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    n, dims = int.from_bytes(data[4:8], "big"), data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    arr = np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)
    return torch.from_numpy(arr.copy()), n


def load(data_dir, split):
    def find(base):
        for name in (base + ".gz", base):
            if os.path.exists(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        raise SystemExit(f"missing {os.path.join(data_dir, base)}[.gz]")
    x, _ = idx(find(f"{split}-images-idx3-ubyte"))
    y, _ = idx(find(f"{split}-labels-idx1-ubyte"))
    return (x.float().div(255).sub(0.2860).div(0.3530)), y.long()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithm", default="allreduce", choices=["allreduce", "zero", "zero3", "fused", "hybrid"])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128, help="per rank")
    ap.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0 = all)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--bf16", action="store_true", help="mixed precision (allreduce, zero3)")
    a = ap.parse_args()
    if a.bf16 and a.algorithm not in ("allreduce", "zero3"):
        ap.error("--bf16 goes with --algorithm allreduce or zero3")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    job = {"communicator": "tcp", "reducer": "mean"}
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    if a.bf16:  # before the optimizer: its fp32 masters are copies of these weights
        model.to(dtype)
        job["precision"] = {"dtype": "bf16"}
    if a.algorithm == "zero":  # PyTorch's ZeroRedundancyOptimizer, distopt's zero plugin
        opt = distopt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                              lr=1e-3, job=job)
    elif a.algorithm == "zero3":  # FSDP: every nn.Linear a unit (its ModuleWrapPolicy)
        opt = distopt.DistributedOptimizer(
            model, dict(job, algorithm={"name": "zero", "options": {"stage": 3}},
                        optimizer={"name": "adam", "lr": 1e-3}), units={nn.Linear})
    elif a.algorithm == "fused":  # Bagua's fuse_optimizer
        opt = distopt.fuse_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3), job=job)
    elif a.algorithm == "hybrid":  # Megatron's HybridDeviceOptimizer
        opt = distopt.HybridDeviceOptimizer(model.parameters(), offload_fraction=0.5,
                                            optimizer_class=torch.optim.Adam, lr=1e-3, job=job)
    else:
        opt = distopt.DistributedOptimizer(model, dict(job, algorithm="allreduce",
                                                       optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9}))
    rt = opt.runtime
    rank, world = rt.rank, rt.world_size
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
            idx_ = perm[step * global_batch + rank * a.batch:step * global_batch + (rank + 1) * a.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(train_x[idx_].to(dtype)).float(), train_y[idx_])
            opt.scale_loss(loss).backward()  # times the loss scale (1 without --bf16)
            opt.step()
        # Each rank evaluates its share of the test set; the counts are summed over ranks.
        # (zero3: a unit's forward is a collective, so every rank runs the same number
        # of forwards: one here.)
        model.eval()
        lo, hi = len(test_y) * rank // world, len(test_y) * (rank + 1) // world
        with torch.no_grad():
            correct = (model(test_x[lo:hi].to(dtype)).argmax(1) == test_y[lo:hi]).sum().item()
        counts = torch.tensor([float(correct), float(hi - lo)], dtype=torch.float64)
        rt.allreduce(counts)
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {100 * counts[0].item() / counts[1].item():.2f}% "
                  f"({a.algorithm}{', bf16' if a.bf16 else ''}, {world} ranks)", flush=True)


if __name__ == "__main__":
    main()
