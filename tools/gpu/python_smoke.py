#!/usr/bin/env python3
"""The Python package on one device (tools/gpu/smoke.sh's "python" row): a
small MLP trained with distopt.DistributedOptimizer (allreduce),
distopt.ZeroRedundancyOptimizer, and PyTorch's DDP over the "distopt"
torch.distributed backend (nccl for a CUDA DEVICE) at world size 1 on
DEVICE, each against the same steps of plain PyTorch on DEVICE. Prints one line per optimizer and
exits non-zero on a mismatch. Usage: python_smoke.py DEVICE PLUGIN_DIR
(each optimizer in its own process: one distopt runtime per process)."""

import subprocess
import sys

import torch
import torch.nn.functional as F

import distopt

device, plugins = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(1)
xs = torch.randn(20, 64, 32, generator=g).to(device)
ys = torch.randint(0, 4, (20, 64), generator=g).to(device)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 4)).to(device)


def train(m, opt):
    for x, y in zip(xs, ys):
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    return {n: p.detach() for n, p in m.named_parameters()}


job = {"plugins": {"paths": [plugins]}, "communicator": "tcp" if device == "cpu" else "nccl",
       "reducer": "mean"}
if len(sys.argv) == 3:  # the parent: one process per optimizer
    codes = [subprocess.call([sys.executable, __file__, device, plugins, name])
             for name in ("allreduce", "zero", "ddp")]
    sys.exit(1 if any(codes) else 0)
name = sys.argv[3]
ref_model = model()
ref = train(ref_model, torch.optim.Adam(ref_model.parameters(), lr=1e-2))
m = model()
if name == "allreduce":
    opt = distopt.DistributedOptimizer(m, dict(job, algorithm="allreduce",
                                               optimizer={"name": "adam", "lr": 1e-2}))
elif name == "zero":
    opt = distopt.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2,
                                          job=job)
else:  # PyTorch's DDP over the backend, on this device's communicator
    import os
    import tempfile
    import torch.distributed as dist
    distopt.set_backend_options(plugin_paths=[plugins])
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("distopt", init_method=f"file://{store}", rank=0, world_size=1)
    t = torch.arange(4.0, device=device)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(4.0, device=device)), t
    m = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
got = train(m, opt)
got = {k.removeprefix("module."): v for k, v in got.items()}
diff = max((got[k].float() - ref[k].float()).abs().max().item() for k in ref)
ok = diff < 1e-4
print(f"python {name} on {device}: max |param - torch| {diff:.2e} {'PASS' if ok else 'FAIL'}",
      flush=True)
sys.exit(0 if ok else 1)
