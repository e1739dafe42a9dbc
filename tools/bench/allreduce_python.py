#!/usr/bin/python3
"""torch.distributed.all_reduce from Python over the "distopt" backend against
gloo, and `distopt bench comm` (the same communicator without Python), in one
run on this host.

Each backend runs in its own set of N processes (env:// on 127.0.0.1), times
all_reduce (SUM, float32) for sizes doubling from --min-bytes to
--max-bytes, and reports busbw = bytes / time * 2(N-1)/N (nccl-tests'
definition), the median of --repeat passes over the sizes, which alternate
between the backends.

    /usr/bin/python3 tools/bench/allreduce_python.py [-n 2] [--min-bytes 4096]
        [--max-bytes 67108864] [--repeat 3] [--json FILE]

Needs Debian's python3-torch and the build's Python package (build/python).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iterations(nbytes):
    """Fewer iterations for large sizes: about the same time per size."""
    return max(5, min(200, (64 << 20) // max(nbytes, 1) // 4))


def worker(a):
    sys.path.insert(0, os.path.join(BUILD, "python"))
    import torch
    import torch.distributed as dist
    if a.backend == "distopt":
        import distopt  # noqa: F401 (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)
    world = dist.get_world_size()
    rows = []
    size = a.min_bytes
    while size <= a.max_bytes:
        t = torch.ones(size // 4)
        for _ in range(2):
            dist.all_reduce(t)
        n = iterations(size)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        seconds = (time.perf_counter() - start) / n
        rows.append({"bytes": size, "seconds": seconds,
                     "busbw_GBps": size / seconds * 2 * (world - 1) / world / 1e9})
        size *= 2
    if dist.get_rank() == 0:
        print(json.dumps(rows), flush=True)
    dist.destroy_process_group()


def run_backend(a, backend):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(a.n), OMP_NUM_THREADS="1")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend,
            "--min-bytes", str(a.min_bytes), "--max-bytes", str(a.max_bytes)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(a.n)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{backend}: exit codes {[p.returncode for p in procs]}")
    return {r["bytes"]: r["busbw_GBps"] for r in json.loads(outs[0].strip().splitlines()[-1])}


def run_cli(a):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "comm.json")
        r = subprocess.run([os.path.join(BUILD, "bin", "distopt"), "bench", "comm", "-n", str(a.n),
                            "--min-bytes", str(a.min_bytes), "--max-bytes", str(a.max_bytes),
                            "--json", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if r.returncode:
            raise SystemExit("distopt bench comm failed:\n" + r.stdout)
        with open(out) as f:
            table = json.load(f)
    rows = table["rows"] if isinstance(table, dict) else table
    return {int(r["bytes"]): float(r["busbw_gbs"]) for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="distopt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    runs = {"gloo": [], "distopt": [], "cli": []}
    for rep in range(a.repeat):
        order = ["gloo", "distopt", "cli"] if rep % 2 == 0 else ["cli", "distopt", "gloo"]
        for name in order:
            runs[name].append(run_cli(a) if name == "cli" else run_backend(a, name))
            print(f"  pass {rep + 1}: {name} done", file=sys.stderr, flush=True)
    med = {k: {b: statistics.median(r[b] for r in v) for b in v[0]} for k, v in runs.items()}
    print(f"{a.n} ranks on one host, all_reduce SUM float32, busbw GB/s (median of {a.repeat})")
    print(f"{'bytes':>10s} {'gloo':>8s} {'distopt':>8s} {'vs gloo':>8s} {'bench comm':>11s} "
          f"{'py/bench':>9s}")
    for b in sorted(med["gloo"]):
        g, d, c = med["gloo"][b], med["distopt"][b], med["cli"].get(b, float("nan"))
        print(f"{b:10d} {g:8.2f} {d:8.2f} {d / g:7.2f}x {c:11.2f} {d / c:8.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(med, f, indent=1)


if __name__ == "__main__":
    main()
