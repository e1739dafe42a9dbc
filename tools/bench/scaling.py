#!/usr/bin/python3
"""Ranks x threads on one host: which split of the cores trains fastest.

For every (ranks R, intra-op threads per rank T) with R x T <= cores, runs
`distopt train` on the quickstart job (mlp, SGD lr 0.1 momentum 0.9, tcp +
mean + allreduce) at a fixed global batch (512: 512 / R per rank), plus one
run per R with no threads setting (what distopt chooses by itself, marked
"auto"), plus PyTorch alone (one process, the same mlp, batch, threads and
BLAS) as the baseline a user would pick instead. Repetitions are
interleaved; each cell is the median. Prints one table: samples/s (training
steps only, the per-epoch test evaluation excluded), test accuracy, and the
ratio to the best single-process distopt configuration of the same run.

    tools/bench/scaling.py [--epochs 3] [--reps 3] [--cores N]
        [--pthread-blas] [--kernels Prescott,SkylakeX]

--pthread-blas adds rows with OpenBLAS's pthread build loaded instead of
the OpenMP one (LD_LIBRARY_PATH), the configuration tools/setup.sh moved
away from. --kernels adds 1-rank rows with OPENBLAS_CORETYPE
forced to each kernel set (what distopt's generic-fallback fix is worth).

Needs Debian's python3-torch (run with /usr/bin/python3).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare_ddp import MEAN, STD, ROOT, find, load_idx, mlp  # noqa: E402

PTHREAD_DIR = "/usr/lib/x86_64-linux-gnu/openblas-pthread"


def job_yaml(a, ranks, threads):
    plugins = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.distopt))), "plugins")
    lines = [f"plugins: {{paths: [{plugins}]}}",
             f"world: {{size: {ranks}, timeout_s: 120}}",
             "communicator: {name: tcp}",
             "reducer: {name: mean}",
             "algorithm: {name: allreduce}",
             "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}",
             f"train: {{model: mlp, epochs: {a.epochs}, batch_size: {a.global_batch // ranks}, seed: 0"
             + (f", threads: {threads}" if threads else "") + f", data_dir: {a.data}}}"]
    return "\n".join(lines) + "\n"


def clean_env(extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "DISTOPT_BLAS_REEXEC")}
    env.update(extra)
    return env


def run_distopt(a, ranks, threads, env):
    with tempfile.TemporaryDirectory() as tmp:
        job, metrics = os.path.join(tmp, "job.yaml"), os.path.join(tmp, "m.jsonl")
        with open(job, "w") as f:
            f.write(job_yaml(a, ranks, threads))
        r = subprocess.run([a.distopt, "train", job, "--metrics", metrics], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=clean_env(env))
        if r.returncode != 0:
            sys.stderr.write(r.stdout)
            raise SystemExit(f"distopt train ({ranks} x {threads or 'auto'}) failed: exit {r.returncode}")
        blas = next((l.split("BLAS:", 1)[1].strip() for l in r.stdout.splitlines() if "BLAS:" in l), "?")
        with open(metrics) as f:
            s = [json.loads(l) for l in f if l.strip() and '"summary"' in l][-1]
        return {"sps": s["samples_per_s"], "acc": s["final_test_accuracy"],
                "threads": s.get("threads_per_rank", threads), "blas": blas}


def torch_worker(a):
    """PyTorch alone: one process, global batch, same permutation rule per epoch."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = load_idx(find(a.data, "train-images-idx3-ubyte"), True)
    y = load_idx(find(a.data, "train-labels-idx1-ubyte"), False).long()
    tx = load_idx(find(a.data, "t10k-images-idx3-ubyte"), True)
    ty = load_idx(find(a.data, "t10k-labels-idx1-ubyte"), False).long()

    def norm(u8):
        return (u8.float().div_(255.0).sub_(MEAN)).div_(STD)

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps, elapsed = x.shape[0] // a.global_batch, 0.0
    for epoch in range(1, a.epochs + 1):
        g = torch.Generator()
        g.manual_seed(epoch)
        perm = torch.randperm(x.shape[0], generator=g)
        t0 = time.perf_counter()
        for s in range(steps):
            idx = perm[s * a.global_batch:(s + 1) * a.global_batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(norm(x.index_select(0, idx))), y.index_select(0, idx))
            loss.backward()
            opt.step()
            loss.item()
        elapsed += time.perf_counter() - t0
    with torch.no_grad():
        acc = (model(norm(tx)).argmax(1) == ty).float().mean().item()
    print(json.dumps({"sps": steps * a.epochs * a.global_batch / elapsed, "acc": acc}))


def run_torch(a, threads, env):
    argv = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--threads", str(threads),
            "--epochs", str(a.epochs), "--data", a.data, "--global-batch", str(a.global_batch)]
    r = subprocess.run(argv, stdout=subprocess.PIPE, text=True,
                       env=clean_env(dict(env, OMP_NUM_THREADS=str(threads))))
    if r.returncode != 0:
        raise SystemExit(f"PyTorch run ({threads} threads) failed: exit {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def configurations(a):
    """(label, kind, ranks, threads, env): every run of one repetition."""
    confs = []
    for ranks in range(1, a.cores + 1):
        for threads in range(1, a.cores // ranks + 1):
            confs.append((f"distopt {ranks} x {threads}", "distopt", ranks, threads, {}))
        confs.append((f"distopt {ranks} x auto", "distopt", ranks, 0, {}))
    for threads in range(1, a.cores + 1):
        confs.append((f"PyTorch 1 x {threads}", "torch", 1, threads, {}))
    if a.pthread_blas and os.path.isdir(PTHREAD_DIR):
        pth = {"LD_LIBRARY_PATH": PTHREAD_DIR}
        for threads in range(1, a.cores + 1):
            confs.append((f"distopt 1 x {threads} (pthread BLAS)", "distopt", 1, threads, pth))
            confs.append((f"PyTorch 1 x {threads} (pthread BLAS)", "torch", 1, threads, pth))
    for core in filter(None, a.kernels.split(",")):
        confs.append((f"distopt 1 x {a.cores} ({core} kernels)", "distopt", 1, a.cores,
                      {"OPENBLAS_CORETYPE": core}))
    return confs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--distopt", default=os.path.join(ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"),
                                                      "bin/distopt"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pthread-blas", action="store_true")
    ap.add_argument("--kernels", default="")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if not os.path.exists(a.distopt):
        raise SystemExit(f"no distopt executable at {a.distopt} (pass --distopt)")
    confs = configurations(a)
    results = {c[0]: [] for c in confs}
    blas = {}
    for rep in range(a.reps):
        for label, kind, ranks, threads, env in confs:
            r = run_distopt(a, ranks, threads, env) if kind == "distopt" else run_torch(a, threads, env)
            results[label].append(r)
            blas.setdefault(label, r.get("blas"))
            print(f"rep {rep + 1}/{a.reps} {label}: {r['sps']:.0f} samples/s, acc {100 * r['acc']:.2f}%",
                  file=sys.stderr, flush=True)
    med = {k: {"sps": statistics.median(x["sps"] for x in v), "acc": statistics.median(x["acc"] for x in v),
               "threads": v[0].get("threads")} for k, v in results.items()}
    single = [k for k in med if k.startswith("distopt 1 x ") and "(" not in k]
    best = max(single, key=lambda k: med[k]["sps"])
    print(f"\n{a.cores} cores, global batch {a.global_batch}, {a.epochs} epochs, median of {a.reps}; "
          f"BLAS: {blas.get(best)}")
    print(f"{'configuration (ranks x threads)':40s} {'samples/s':>10s} {'test acc':>9s} {'vs best 1-rank':>15s}")
    for label, *_ in confs:
        m = med[label]
        note = f" (chose {m['threads']})" if label.endswith("auto") else ""
        print(f"{label + note:40s} {m['sps']:10.0f} {100 * m['acc']:8.2f}% {m['sps'] / med[best]['sps']:14.2f}x")
    print(f"best single-process distopt configuration: {best}")


if __name__ == "__main__":
    main()
