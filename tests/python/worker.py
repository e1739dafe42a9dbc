"""One rank of tests/python/test_optimizers.py: trains a small MLP with one
of distopt's Python optimizers on this rank's half of fixed global batches
and saves the final parameters. Usage: worker.py CASE OUT_DIR (started by
`distopt launch -n 2`)."""

import contextlib
import os
import sys

import torch
import torch.nn.functional as F

import distopt
from common import BATCHES, GLOBAL_BATCH, make_model, data

case, out = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
model = make_model(tied=case.endswith("_tied"))
base = {"communicator": "tcp", "reducer": "mean"}
if case == "allreduce_sgd" or case == "no_sync":
    opt = distopt.DistributedOptimizer(model, dict(base, algorithm="allreduce",
                                                   optimizer={"name": "sgd", "lr": 0.1,
                                                              "momentum": 0.9}))
elif case == "peer_dies":
    opt = distopt.DistributedOptimizer(model, dict(base, world={"timeout_s": 20},
                                                   algorithm="allreduce",
                                                   optimizer={"name": "sgd", "lr": 0.1}))
elif case == "zero_adam":
    opt = distopt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=0.01, betas=(0.9, 0.99), job=base)
elif case == "zero2_adamw":
    opt = distopt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                          stage=2, lr=0.01, job=base)
elif case in ("zero3_adam", "zero3_tied"):
    # zero3_adam picks its units by class (FSDP's ModuleWrapPolicy), zero3_tied by default.
    opt = distopt.DistributedOptimizer(model, dict(base, algorithm={"name": "zero",
                                                                    "options": {"stage": 3}},
                                                   optimizer={"name": "adam", "lr": 0.01,
                                                              "beta2": 0.99}),
                                       units={torch.nn.Linear} if case == "zero3_adam" else None)
    assert opt._opt.shards_parameters
    if case == "zero3_tied":  # shared by units 0 and 2, which do not nest: whole
        assert model[0].weight.numel() == 16 * 16 and model[0].bias.numel() == 0
        assert len(opt._params) == 5, len(opt._params)
    else:
        assert model[0].weight.numel() == 0  # sharded between steps
elif case == "zero3_bf16":
    # Mixed precision: the model in bf16, the fp32 masters sharded by stage 3.
    model.to(torch.bfloat16)
    opt = distopt.DistributedOptimizer(model, dict(base, algorithm={"name": "zero",
                                                                    "options": {"stage": 3}},
                                                   optimizer={"name": "adam", "lr": 0.01,
                                                              "beta2": 0.99},
                                                   precision={"dtype": "bf16"}))
    assert opt._opt.shards_parameters and model[0].weight.numel() == 0
elif case == "fused_adam":
    opt = distopt.fuse_optimizer(torch.optim.Adam(model.parameters(), lr=0.01), job=base)
elif case == "hybrid_adam":
    opt = distopt.HybridDeviceOptimizer(model.parameters(), offload_fraction=0.5,
                                        optimizer_class=torch.optim.Adam, lr=0.01, job=base)
else:
    sys.exit(f"unknown case {case}")

rank, world = opt.runtime.rank, opt.runtime.world_size
assert world == 2, world
xs, ys = data()
half = GLOBAL_BATCH // world
for step in range(BATCHES):
    if case == "peer_dies" and rank == 1 and step == 2:
        os._exit(9)  # a crash: no goodbye to the peer
    x, y = xs[step][rank * half:(rank + 1) * half], ys[step][rank * half:(rank + 1) * half]
    opt.zero_grad()
    if case == "no_sync":  # two micro-batches, the first only accumulates
        with opt.no_sync():
            (F.cross_entropy(model(x[:half // 2]), y[:half // 2]) * 0.5).backward()
        (F.cross_entropy(model(x[half // 2:]), y[half // 2:]) * 0.5).backward()
    elif case == "zero3_bf16":
        loss = F.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
        opt.scale_loss(loss).backward()
    else:
        F.cross_entropy(model(x), y).backward()
    try:
        opt.step()
    except distopt.Error as e:
        print(f"rank {rank}: distopt.Error: {e}", flush=True)
        sys.exit(3)
assert opt.steps == BATCHES
gathered = opt.gather_params() if case.startswith("zero3") else contextlib.nullcontext()
with gathered:
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
               os.path.join(out, f"params_{rank}.pt"))
if case == "zero3_bf16":  # the fp32 masters (the algorithm's shards), gathered on rank 0
    whole = opt.consolidate(0)
    if rank == 0:
        torch.save({n: whole[f"master/{n}"] for n, _ in model.named_parameters()},
                   os.path.join(out, "masters.pt"))
if case == "allreduce_sgd":
    info = opt.save_checkpoint(os.path.join(out, "ck"), {"note": "python"})
    assert info["step"] == str(BATCHES), info
    whole = opt.consolidate(0)
    if rank == 0:
        torch.save(whole, os.path.join(out, "consolidated.pt"))
    # A fresh optimizer over a perturbed model restores the checkpoint.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt.load_checkpoint(os.path.join(out, "ck"))
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
               os.path.join(out, f"restored_{rank}.pt"))
    total = torch.tensor([float(rank + 1)])
    opt.runtime.allreduce(total)
    assert total.item() == 3.0, total
    opt.runtime.barrier()
