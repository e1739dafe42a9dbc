#!/usr/bin/python3
"""Compare `distopt train` with PyTorch DDP (gloo) on the same job, in one run.

Both sides train the same mlp (784-512-256-10, ReLU) on the same Fashion-MNIST
IDX files, with the same ranks on 127.0.0.1, per-rank batch, global batch,
epochs, inner optimizer and intra-op threads per rank; both time only the
training steps (the per-epoch test evaluation is excluded) and evaluate the
full 10k test set. Prints one table: samples/s, test accuracy, ratio.

    tools/bench/compare_ddp.py [--config share/distopt/examples/allreduce-sgd.yaml]
        [--distopt build/bin/distopt] [--plugin-path build/plugins] [--threads N]
        [--epochs N] [--data /usr/share/datasets/fashion-mnist]

Needs Debian's python3-torch (run with /usr/bin/python3) and python3-yaml.
"""
import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MEAN, STD = 0.2860, 0.3530


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_idx(path, image):
    import numpy as np
    import torch
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic != (0x803 if image else 0x801):
        raise SystemExit(f"malformed IDX file {path}: magic {magic:#010x}")
    n = int.from_bytes(data[4:8], "big")
    if image:
        rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        arr = np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, 1, rows, cols)
    else:
        arr = np.frombuffer(data, dtype=np.uint8, offset=8)
    return torch.from_numpy(arr.copy())


def find(data_dir, base):
    for name in (base + ".gz", base):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    raise SystemExit(f"Fashion-MNIST file missing: {os.path.join(data_dir, base + '.gz')}")


def mlp():
    """The mlp of `distopt train` (784-512-256-10, ReLU)."""
    import torch.nn as nn
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def train_ddp(a, model, ddp, opt, seed, label, max_steps=0, epoch_begin=None, epoch_end=None,
              step_begin=None, step_end=None):
    """Train `ddp` (DDP around `model`) with `opt` for a.epochs epochs on the batches `distopt train`
    takes (the same seeded permutation on every rank, slice `rank` of each global batch), timing only
    the steps, then evaluate the full test set sharded across ranks. The optional callbacks run around
    each epoch's steps and each step. Returns (train_time_s, final test accuracy, steps per epoch)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    train_x = load_idx(find(a.data, "train-images-idx3-ubyte"), True)
    train_y = load_idx(find(a.data, "train-labels-idx1-ubyte"), False).long()
    test_x = load_idx(find(a.data, "t10k-images-idx3-ubyte"), True)
    test_y = load_idx(find(a.data, "t10k-labels-idx1-ubyte"), False).long()

    def norm(u8):
        return (u8.float().div_(255.0).sub_(MEAN)).div_(STD)

    n = train_x.shape[0]
    global_batch = a.batch * world
    steps = n // global_batch
    if max_steps > 0:
        steps = min(steps, max_steps)
    train_time, acc = 0.0, 0.0
    for epoch in range(1, a.epochs + 1):
        g = torch.Generator()
        g.manual_seed(seed * 1000003 + epoch)
        perm = torch.randperm(n, generator=g)  # the same on every rank
        model.train()
        t0 = time.perf_counter()
        if epoch_begin:
            epoch_begin()
        for step in range(steps):
            idx = perm[step * global_batch + rank * a.batch:step * global_batch + (rank + 1) * a.batch]
            x, y = norm(train_x.index_select(0, idx)), train_y.index_select(0, idx)
            if step_begin:
                step_begin()
            opt.zero_grad()
            loss = F.nll_loss(F.log_softmax(ddp(x), 1), y)
            loss.backward()
            opt.step()
            loss.item()
            if step_end:
                step_end()
        if epoch_end:
            epoch_end()
        train_time += time.perf_counter() - t0
        # Full test set, sharded across ranks, as distopt evaluates it.
        model.eval()
        lo, hi = len(test_y) * rank // world, len(test_y) * (rank + 1) // world
        with torch.no_grad():
            correct = sum(int((model(norm(test_x[b:min(hi, b + 1000)])).argmax(1) == test_y[b:min(hi, b + 1000)])
                              .sum()) for b in range(lo, hi, 1000))
        t = torch.tensor([float(correct), float(hi - lo)], dtype=torch.float64)
        dist.all_reduce(t)
        acc = t[0].item() / t[1].item()
        if rank == 0:
            print(f"{label}: epoch {epoch}/{a.epochs} test accuracy {100 * acc:.2f}%", file=sys.stderr, flush=True)
    return train_time, acc, steps


def ddp_worker(a):
    """One DDP rank (RANK/WORLD_SIZE/MASTER_* set)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.ddp_backend == "distopt":  # the build's package registers the backend
        sys.path.insert(0, os.path.join(ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"), "python"))
        import distopt  # noqa: F401
    dist.init_process_group(a.ddp_backend, rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    model = mlp()
    ddp = DDP(model)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                              weight_decay=a.weight_decay)
    elif a.optimizer == "adam":
        opt = torch.optim.Adam(ddp.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    elif a.optimizer == "adamw":
        opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    else:
        raise SystemExit(f"compare_ddp.py: optimizer {a.optimizer} is not supported here")
    train_time, acc, steps = train_ddp(a, model, ddp, opt, a.seed, "ddp", a.max_steps)
    if rank == 0:
        print(json.dumps({"samples_per_s": steps * a.epochs * a.batch * world / train_time,
                          "final_test_accuracy": acc, "train_time_s": train_time}), flush=True)
    dist.barrier()
    # No teardown: torch 1.13's gloo group can hang in its destructor at exit
    # (its worker threads wait for the GIL that the joining thread holds).
    sys.stderr.flush()
    os._exit(0)


def run_ddp(a, backend=None):
    if backend:
        a = argparse.Namespace(**dict(vars(a), ddp_backend=backend))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(a.world),
               OMP_NUM_THREADS=str(a.threads))
    argv = [sys.executable, os.path.abspath(__file__), "--ddp-worker"] + worker_args(a)
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(a.world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"DDP run failed: exit codes {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def run_distopt(a):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        argv = [a.distopt, "train", a.config, "--metrics", metrics, "--threads", str(a.threads),
                "--epochs", str(a.epochs), "--data", a.data]
        if a.max_steps > 0:
            argv += ["--max-steps", str(a.max_steps)]
        for p in a.plugin_path:
            argv += ["--plugin-path", p]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
        for line in r.stdout.splitlines():
            if "summary" in line or ": train loss" in line or "error" in line or "failed" in line:
                print("distopt: " + line, file=sys.stderr)
        if r.returncode != 0:
            sys.stderr.write(r.stdout)
            raise SystemExit(f"distopt train failed (exit code {r.returncode})")
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [m for m in rows if m.get("event") == "summary"][-1]


def comparison_parser(doc):
    """The arguments every side-by-side script shares (compare_powersgd, compare_zero); also picks the
    best OpenBLAS kernels for both sides (inherited by every rank)."""
    if "OPENBLAS_CORETYPE" not in os.environ and best_openblas_coretype():
        os.environ["OPENBLAS_CORETYPE"] = best_openblas_coretype()
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = os.environ.get("DISTOPT_BUILD_DIR", "build")
    ap.add_argument("--distopt", default=os.path.join(ROOT, build, "bin/distopt"))
    ap.add_argument("--plugin-path", action="append", default=[])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (0: cores / ranks)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="per rank")
    ap.add_argument("--ddp-backend", default="gloo",
                    help="torch.distributed backend of the DDP side (gloo, or distopt: the build's package)")
    return ap


def parse_comparison_args(ap):
    """Parse, defaulting threads to cores / ranks."""
    a = ap.parse_args()
    a.threads = a.threads or max(1, (os.cpu_count() or 1) // a.world)
    return a


def check_distopt(a):
    """Default the plugin path to the build's, and fail early without the executable."""
    if not a.plugin_path:
        a.plugin_path = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.distopt))), "plugins")]
    if not os.path.exists(a.distopt):
        raise SystemExit(f"no distopt executable at {a.distopt} (pass --distopt)")


def worker_args(a):
    return ["--data", a.data, "--threads", str(a.threads), "--epochs", str(a.epochs), "--seed", str(a.seed),
            "--batch", str(a.batch), "--max-steps", str(a.max_steps), "--optimizer", a.optimizer, "--lr", str(a.lr),
            "--momentum", str(a.momentum), "--weight-decay", str(a.weight_decay),
            "--ddp-backend", a.ddp_backend] + (["--nesterov"] if a.nesterov
                                                                                  else [])


def blas_name():
    name = "unknown"
    for link in ("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", "/etc/alternatives/libblas.so.3"):
        if os.path.exists(link):
            name = os.path.realpath(link)
            break
    return name + ", OPENBLAS_CORETYPE=" + os.environ.get("OPENBLAS_CORETYPE", "(auto)")


GENERIC_KERNELS = ("Prescott", "Core2", "Nehalem", "Sandybridge", "Katmai", "Coppermine", "Northwood", "Banias",
                   "Atom", "Penryn", "Dunnington")


def best_openblas_coretype():
    """The OPENBLAS_CORETYPE `distopt` itself sets (core/src/machine/blas.cpp, openblas_coretype_rule): the best
    kernel set of the CPU, but only where OpenBLAS fell back to a generic one (as it does for CPU models it
    does not recognise, e.g. some VMs); "" where OpenBLAS's own choice stands. Both sides of a comparison
    must get the same, or it measures the BLAS, not the distributed runtime."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return ""
    best = ""
    if all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        best = "SkylakeX"
    elif "avx2" in flags and "fma" in flags:
        best = "Haswell"
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        own = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return ""
    if not best or own.lower() == best.lower():
        return ""
    if own.lower() in (g.lower() for g in GENERIC_KERNELS) or (own == "Haswell" and best == "SkylakeX"):
        return best
    return ""


def main():
    if "OPENBLAS_CORETYPE" not in os.environ and best_openblas_coretype():
        os.environ["OPENBLAS_CORETYPE"] = best_openblas_coretype()  # inherited by both sides' ranks
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "share/distopt/examples/allreduce-sgd.yaml"))
    ap.add_argument("--distopt", default=os.path.join(ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"), "bin/distopt"))
    ap.add_argument("--plugin-path", action="append", default=[])
    ap.add_argument("--data", default=None)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (0: from the job, else cores/ranks)")
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ddp-backend", default="gloo",
                    help="torch.distributed backend of the DDP side (gloo, or distopt: the build's package)")
    # Worker-only settings (the parent derives them from the job file).
    for name, typ in (("--seed", int), ("--batch", int), ("--lr", float), ("--momentum", float),
                      ("--weight-decay", float)):
        ap.add_argument(name, type=typ, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", default="sgd", help=argparse.SUPPRESS)
    ap.add_argument("--nesterov", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ddp_worker:
        return ddp_worker(a)

    import yaml
    with open(a.config) as f:
        job = yaml.safe_load(f)
    train, world, opt = job.get("train", {}), job.get("world", {}), dict(job.get("optimizer", {}))
    if train.get("model", "mlp") != "mlp":
        raise SystemExit("compare_ddp.py compares the mlp model only")
    a.world = int(world.get("size", 1))
    a.batch = int(train.get("batch_size", 256))
    a.seed = int(train.get("seed", 0))
    a.epochs = a.epochs or int(train.get("epochs", 2))
    a.data = a.data or train.get("data_dir", "/usr/share/datasets/fashion-mnist")
    a.threads = a.threads or int(train.get("threads", 0)) or max(1, (os.cpu_count() or 1) // a.world)
    a.optimizer = opt.get("name", "sgd")
    a.lr = float(opt.get("lr", 0.01 if a.optimizer == "sgd" else 1e-3))
    a.momentum = float(opt.get("momentum", 0.0))
    a.nesterov = bool(opt.get("nesterov", False))
    a.weight_decay = float(opt.get("weight_decay", 0.0))
    if not os.path.exists(a.distopt):
        raise SystemExit(f"no distopt executable at {a.distopt} (pass --distopt)")

    print(f"job {a.config}: {a.world} ranks x {a.threads} thread(s), mlp, batch {a.batch}/rank "
          f"(global {a.batch * a.world}), {a.epochs} epoch(s), {a.optimizer} lr {a.lr}; BLAS {blas_name()}",
          flush=True)
    ddp = run_ddp(a)
    ours = run_distopt(a)
    rows = [("PyTorch DDP (gloo)", ddp), (f"distopt ({ours.get('communicator')}/{ours.get('algorithm')})", ours)]
    print(f"\n{'':28s} {'samples/s':>10s} {'test acc':>9s} {'train s':>8s}")
    for name, r in rows:
        print(f"{name:28s} {r['samples_per_s']:10.0f} {100 * r['final_test_accuracy']:8.2f}% "
              f"{r.get('train_time_s', 0):8.2f}")
    print(f"{'ratio distopt / DDP':28s} {ours['samples_per_s'] / ddp['samples_per_s']:9.2f}x "
          f"{100 * (ours['final_test_accuracy'] - ddp['final_test_accuracy']):+8.2f}pp")


if __name__ == "__main__":
    main()
