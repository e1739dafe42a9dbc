#!/usr/bin/env python3
"""distopt's zero stage 3 from Python against PyTorch's FSDP (FULL_SHARD), in one run.

The model of `distopt bench shard`: an MLP of --layers square Linear layers
(about --params parameters, ReLU between), each layer one unit (FSDP:
ModuleWrapPolicy({nn.Linear}); distopt: units={nn.Linear}), Adam in fp32
(lr 1e-4), --batch random samples per rank and step, loss mean(out^2). Both
start from the same parameters (seed 1) and see the same samples. Each rank
is a separate process with --threads threads; every configuration is a new
set of processes, FSDP and distopt in turn at each world size:

  samples/s  the global batch over the median step time of the slowest rank
             (--steps timed steps after one warm-up step);
  peak       on the CPU, the largest per-rank resident-memory high-water mark
             (VmHWM, reset after the warm-up step through /proc/self/clear_refs)
             less what the rank held before building the model, with malloc's
             mmap threshold fixed at 1 MiB (as `distopt bench shard`); on CUDA,
             torch.cuda.max_memory_allocated over the timed steps;
  diff       the largest |difference| of FSDP's and of distopt's parameters
             after the last step from a single process running plain
             torch.optim.Adam on the global batch (every 997th element).

FSDP: FullyShardedDataParallel(FULL_SHARD, device_id, gloo on the CPU, nccl on
CUDA). distopt: DistributedOptimizer(model, job with algorithm zero stage 3,
communicator tcp on the CPU, nccl on CUDA; default overlap_comm: false).
Needs a PyTorch whose FSDP runs on the device (2.x: on the CPU Debian 13's 2.6,
on CUDA PyTorch's wheels) and distopt's Python package built against it:

    python3 tools/bench/compare_fsdp.py [--params 1e8] [--ranks 1,2,4] [--steps 5]
        [--device cpu|cuda] [--python-path BUILD/python] [--plugin-path BUILD/plugins]
    # Debian 13 in a chroot (torch 2.6), this checkout at /src:
    DISTOPT_BUILD_TARGETS="_distopt tcp mean zero" \\
      DISTOPT_TRIXIE_RUN="python3 tools/bench/compare_fsdp.py" tools/trixie/test.sh
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"))


def width_for(a):
    """Square layers of width w (a multiple of 8) with layers x (w^2 + w) >= params."""
    w = math.ceil(math.sqrt(a.params / max(1, a.layers)))
    return max(8, (w + 7) // 8 * 8)


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(a):
    import ctypes
    # Blocks of 1 MiB and more are mapped on their own: a freed buffer leaves
    # the resident set at once (M_MMAP_THRESHOLD = -3), as in bench shard.
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    width = width_for(a)
    base = status_bytes("VmRSS")
    torch.manual_seed(1)
    layers = []
    for i in range(a.layers):
        layers.append(torch.nn.Linear(width, width))
        if i + 1 < a.layers:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(dev)
    ranks = [rank]
    if a.worker == "reference":  # one process, the global batch, plain Adam
        ranks = list(range(a.world))
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    elif a.worker == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
                     sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=dev)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    else:
        sys.path.insert(0, a.python_path)
        import distopt
        job = {"communicator": "nccl" if cuda else "tcp", "reducer": "mean",
               "algorithm": {"name": "zero", "options": {"stage": 3}},
               "optimizer": {"name": "adam", "lr": a.lr}, "plugins": {"paths": [a.plugin_path]}}
        opt = distopt.DistributedOptimizer(model, job, units={torch.nn.Linear})
    secs = []
    loss = None
    for s in range(a.steps + 1):  # the first step is warm-up
        x = torch.cat([torch.randn(a.batch, width,
                                   generator=torch.Generator().manual_seed(1000 + s * a.world + r))
                       for r in ranks]).to(dev)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        secs.append(time.perf_counter() - t0)
        if s == 0:  # the peaks from here on
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
    peak = torch.cuda.max_memory_allocated() if cuda else status_bytes("VmHWM") - base
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def sample():
        return torch.cat([t.detach().reshape(-1)[::997].double().cpu()
                          for m in linears for t in (m.weight, m.bias)])

    if a.worker == "reference":
        params = sample()
    elif a.worker == "fsdp":
        with FSDP.summon_full_params(model):
            params = sample()
        dist.destroy_process_group()
    else:
        with opt.gather_params():
            params = sample()
    if rank == 0:
        torch.save(params, a.out)
    print(json.dumps({"seconds": statistics.median(secs[1:]), "peak": peak,
                      "loss": float(loss.detach().cpu())}), flush=True)


def run(a, kind, world, out):
    procs_n = 1 if kind == "reference" else world
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(procs_n), OMP_NUM_THREADS=str(a.threads), USE_LIBUV="0",
               DISTOPT_RENDEZVOUS=f"tcp://127.0.0.1:{free_port()}", DISTOPT_JOB_TOKEN="bench",
               DISTOPT_WORLD_SIZE=str(world), DISTOPT_LOCAL_WORLD_SIZE=str(world))
    argv = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--out", out,
            "--params", str(a.params), "--layers", str(a.layers), "--batch", str(a.batch),
            "--steps", str(a.steps), "--threads", str(a.threads), "--lr", str(a.lr),
            "--device", a.device, "--python-path", a.python_path, "--plugin-path", a.plugin_path,
            "--world", str(world)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r), DISTOPT_RANK=str(r),
                                             DISTOPT_LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(procs_n)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"compare_fsdp: {kind} at {world} ranks failed: exit codes "
                         f"{[p.returncode for p in procs]}")
    rs = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return {"samples_per_s": a.batch * world / max(r["seconds"] for r in rs),
            "peak": max(r["peak"] for r in rs), "loss": rs[0]["loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=1e8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up)")
    ap.add_argument("--ranks", default="1,2,4", help="world sizes, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--python-path", default=os.path.join(BUILD, "python"))
    ap.add_argument("--plugin-path", default=os.path.join(BUILD, "plugins"))
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    import torch
    width = width_for(a)
    p = a.layers * (width * width + width)
    comm = "nccl / nccl" if a.device == "cuda" else "gloo / tcp on loopback"
    print(f"# compare_fsdp: MLP of {a.layers} Linear({width}, {width}) units, {p:.3g} parameters, Adam "
          f"fp32, {a.batch} samples per rank and step, {a.threads} thread(s) per rank, {a.device} "
          f"(FSDP / distopt: {comm}), torch {torch.__version__}")
    print("# samples/s: global batch over the median step of the slowest rank; peak: max over ranks of "
          + ("max_memory_allocated" if a.device == "cuda" else
             "VmHWM in the timed steps minus RSS before the model (mmap threshold 1 MiB)")
          + f"; theory: 16P/N; diff: max |parameters - a one-process torch.optim.Adam run on the global "
          f"batch| after {a.steps + 1} steps")
    print(f"# {'ranks':>5s} {'FSDP sam/s':>11s} {'distopt':>9s} {'ratio':>6s} {'FSDP MiB':>9s} "
          f"{'distopt':>9s} {'ratio':>6s} {'theory':>7s} {'FSDP diff':>10s} {'distopt diff':>12s}",
          flush=True)
    mib = 1024.0 * 1024.0
    with tempfile.TemporaryDirectory() as tmp:
        for world in [int(w) for w in a.ranks.split(",")]:
            f_out, d_out, r_out = (os.path.join(tmp, n + ".pt") for n in ("fsdp", "distopt", "ref"))
            f = run(a, "fsdp", world, f_out)
            d = run(a, "distopt", world, d_out)
            run(a, "reference", world, r_out)
            ref = torch.load(r_out)
            f_diff = (torch.load(f_out) - ref).abs().max().item()
            d_diff = (torch.load(d_out) - ref).abs().max().item()
            print(f"  {world:5d} {f['samples_per_s']:11.1f} {d['samples_per_s']:9.1f} "
                  f"{d['samples_per_s'] / f['samples_per_s']:5.2f}x {f['peak'] / mib:9.0f} "
                  f"{d['peak'] / mib:9.0f} {d['peak'] / f['peak']:5.2f}x {16 * p / world / mib:7.0f} "
                  f"{f_diff:10.2e} {d_diff:12.2e}", flush=True)


if __name__ == "__main__":
    main()
