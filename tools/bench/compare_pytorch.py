#!/usr/bin/python3
"""Compare `distopt bench comm` with PyTorch's gloo allreduce, in one run.

Runs, for each world size and `--repeat` times, distopt's benchmark (its JSON
output) once per variant -- by default `tcp` with its shared-memory transport (the default
when all ranks share a host) and TCP only (`shm: false`), and, when the
`ucx` plugin was built, `ucx` with its defaults (distopt's shared memory on
one host, like tcp), and with `shm: false`: UCX's default transports, with
UCX_TLS=tcp, and with `peer_errors: false` (UCX's shared-memory transports)
-- and the same sizes through torch.distributed's gloo backend on
127.0.0.1, and through Open MPI's MPI_Allreduce (tools/bench/mpi/mpi_allreduce.c,
built here when `mpicc` and `mpirun` are found; --no-mpi leaves it out; its
shared-memory BTL `vader` on one host). The columns alternate within each repetition, in an order that
changes from one repetition to the next (a Williams design: each column
runs first, and after each other column, equally often), so that load
drift on a shared machine, and what one run leaves behind for the next,
hit them alike. Both sides warm up before timing (20 untimed
iterations at the first size, 2 at the others) and time every iteration
on its own (the slowest rank's); a run's figure per size is the median
iteration. The table: size, each column's busbw (nccl-tests definition:
algbw * 2(n-1)/n) as the median over the repetitions with their min-max,
and the ratios of the medians to gloo and to Open MPI. At 2 ranks a
`bound` column gives the memory bound for a shared-memory allreduce:
the aggregate copy rate of 2 processes copying buffers of that size at once
(tools/bench/mpi/membw.c, bytes read plus written) over the 3.5 bytes a
rank moves per byte reduced, times 2 ranks (--no-bound leaves it out).
`bound-ab` adds a latency term to that bound's time: one one-way latency
between two processes spinning on a shared cache line (membw --pingpong),
the least any allreduce waits for its peer; below about 64 KiB the copies
are in cache and that latency is most of the limit.

usage: tools/bench/compare_pytorch.py [--distopt build/bin/distopt] [-n 2 4]
           [--min-bytes 4096] [--max-bytes 64M] [--communicator NAME] [--plugin-path DIR]
           [--variant NAME=OPTIONS ...] [--repeat 3] [--no-mpi] [--no-gloo] [--no-bound]
--communicator NAME measures that communicator alone (its variants:
--variant, else NAME={}, or tcp's two).
Needs Debian's python3-torch (run with /usr/bin/python3).
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iters_for(nbytes):
    # Same rule as `distopt bench comm`: 5..200 iterations, ~512 MiB per size.
    return max(5, min(200, (512 << 20) // nbytes))


def gloo_worker(rank, world, port, sizes, out_path):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    rows = []
    buf = torch.ones(max(sizes) // 4, dtype=torch.float32)
    for nbytes in sizes:
        count = nbytes // 4
        count -= count % world
        t = buf[:count]
        # As `distopt bench comm`: the first size also pays for connection and page warm-up.
        for _ in range(20 if nbytes == sizes[0] else 2):
            dist.all_reduce(t)
        dist.barrier()
        it = iters_for(nbytes)
        secs = torch.zeros(it, dtype=torch.float64)
        for i in range(it):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            secs[i] = time.perf_counter() - t0
        dist.all_reduce(secs, op=dist.ReduceOp.MAX)  # the slowest rank, as distopt reports
        med = secs.median().item() if it % 2 else secs.sort().values[it // 2 - 1:it // 2 + 1].mean().item()
        algbw = count * 4 / med / 1e9
        rows.append({"bytes": count * 4, "time_us": med * 1e6, "time_min_us": secs.min().item() * 1e6,
                     "time_max_us": secs.max().item() * 1e6, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (world - 1) / world})
    dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def run_gloo(world, sizes):
    port = free_port()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    procs = [subprocess.Popen([sys.executable, __file__, "--gloo-worker", str(r), str(world), str(port), out,
                               ",".join(map(str, sizes))]) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit("gloo benchmark failed (exit codes %s)" % codes)
    with open(out) as f:
        rows = json.load(f)
    os.unlink(out)
    return rows


def build_mpi():
    """Compile the Open MPI anchor; None (with the reason printed) when it cannot."""
    import shutil
    if not shutil.which("mpicc") or not shutil.which("mpirun"):
        print("# Open MPI: mpicc/mpirun not found (Debian: openmpi-bin libopenmpi-dev); no MPI column")
        return None
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi", "mpi_allreduce.c")
    exe = os.path.join(tempfile.mkdtemp(prefix="distopt_mpi_"), "mpi_allreduce")
    res = subprocess.run(["mpicc", "-O2", "-o", exe, src], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        print("# Open MPI: mpicc failed; no MPI column:\n" + res.stdout)
        return None
    return exe


def mpi_version():
    res = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return res.stdout.splitlines()[0] if res.stdout else "mpirun"


def run_mpi(args, exe, world):
    cmd = ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [exe, "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes)]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        sys.exit("Open MPI benchmark failed:\n" + res.stdout)
    rows = []
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) == 6 and not line.startswith("#") and f[0].isdigit():
            rows.append({"bytes": int(f[0]), "time_us": float(f[2]), "algbw_gbs": float(f[4]),
                         "busbw_gbs": float(f[5])})
    return rows


def build_membw():
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("# memory bound: no C compiler; no bound column")
        return None
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi", "membw.c")
    exe = os.path.join(tempfile.mkdtemp(prefix="distopt_membw_"), "membw")
    res = subprocess.run([cc, "-O2", "-o", exe, src], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    if res.returncode != 0:
        print("# memory bound: cannot build membw.c; no bound column:\n" + res.stdout)
        return None
    return exe


# The model: a 2-rank shared-memory allreduce moves about 3.5 bytes
# (read or written) per byte reduced, per rank.
BYTES_PER_BYTE = 3.5


def run_bound(exe, world, sizes):
    rows = []
    for nbytes in sizes:
        iters = max(5, min(200, (256 << 20) // nbytes))
        res = subprocess.run([exe, "--procs", str(world), "--bytes", str(nbytes), "--iters", str(iters),
                              "--repeat", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if res.returncode != 0:
            sys.exit("membw failed:\n" + res.stdout)
        rate = float(res.stdout.split("GB/s=")[1].split()[0])
        algbw = rate / (BYTES_PER_BYTE * world)
        rows.append({"bytes": nbytes, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (world - 1) / world})
    return rows


def run_bound_ab(exe, world, sizes):
    """The memory bound with a latency term: one allreduce takes at least
    one one-way latency between two processes (a peer must see what this
    rank wrote; membw --pingpong) plus the bound's copy time."""
    res = subprocess.run([exe, "--pingpong", "--iters", "20000", "--repeat", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        sys.exit("membw --pingpong failed:\n" + res.stdout)
    oneway = float(res.stdout.split("oneway_us=")[1].split()[0]) * 1e-6
    rows = []
    for r in run_bound(exe, world, sizes):
        seconds = r["bytes"] / (r["algbw_gbs"] * 1e9) + oneway
        algbw = r["bytes"] / seconds / 1e9
        rows.append({"bytes": r["bytes"], "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (world - 1) / world,
                     "oneway_us": oneway * 1e6})
    return rows


def run_order(n, rep):
    """The order of the n columns in repetition `rep`: row rep of a Williams
    design. Over n repetitions (2n when n is odd) every column runs first
    once and right after every other column equally often. A run leaves
    the machine changed for the next one (caches, a vCPU the host moved):
    a run on 2026-11-27 saw the column that ran second get the better median at
    sizes where two columns ran the same code, under a plain rotation,
    where each column always follows the same one.

    >>> [run_order(4, r) for r in range(4)]
    [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1]]
    >>> [run_order(3, r) for r in range(6)]
    [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0], [0, 2, 1], [1, 0, 2]]
    """
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    row = [(c + rep) % n for c in first]
    return row[::-1] if n % 2 and rep % (2 * n) >= n else row


def run_distopt(args, world, communicator, options, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [args.distopt, "bench", "comm", "--communicator", communicator, "-n", str(world),
           "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--json", out,
           "--options", options]
    for p in args.plugin_path or []:
        cmd += ["--plugin-path", p]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, **(env or {})))
    if res.returncode != 0:
        sys.exit("distopt bench comm failed:\n" + res.stdout)
    with open(out) as f:
        rows = json.load(f)["rows"]
    os.unlink(out)
    return rows


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--gloo-worker":
        rank, world, port, out, sizes = sys.argv[2:7]
        gloo_worker(int(rank), int(world), int(port), [int(s) for s in sizes.split(",")], out)
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--distopt", default=os.path.join(root, "build", "bin", "distopt"), help="the distopt binary")
    ap.add_argument("-n", "--nranks", type=int, nargs="+", default=[2, 4], help="world sizes (2 4)")
    ap.add_argument("--min-bytes", default="4096")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--communicator", default=None, help="only this communicator (default: tcp, and ucx if built)")
    ap.add_argument("--plugin-path", action="append", help="plugin directory for distopt (repeatable)")
    ap.add_argument("--variant", action="append", metavar="NAME=OPTIONS",
                    help="a distopt column: name and communicator options as a YAML map (repeatable; "
                         "default for tcp: shm={} tcp-only={shm: false}, else %s={})")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved repetitions per world size; medians reported (3)")
    ap.add_argument("--no-mpi", action="store_true", help="leave out the Open MPI column")
    ap.add_argument("--no-gloo", action="store_true", help="leave out the gloo column")
    ap.add_argument("--no-bound", action="store_true", help="leave out the memory bound column (2 ranks)")
    args = ap.parse_args()
    membw_exe = None if args.no_bound else build_membw()
    mpi_exe = None if args.no_mpi else build_mpi()
    # The anchors, after the distopt columns: (name, run(world, sizes)).
    anchors = [] if args.no_gloo else [("gloo", lambda world, sizes: run_gloo(world, sizes))]
    if mpi_exe:
        anchors.append(("mpi", lambda world, sizes: run_mpi(args, mpi_exe, world)))
    # (column, communicator, options, extra environment)
    tcp = [("shm", "tcp", "{}", {}), ("tcp-only", "tcp", "{shm: false}", {})]
    ucx = [("ucx", "ucx", "{}", {}), ("ucx-noshm", "ucx", "{shm: false}", {}),
           ("ucx-tcp", "ucx", "{shm: false}", {"UCX_TLS": "tcp"}),
           ("ucx-noerr", "ucx", "{peer_errors: false, shm: false}", {})]
    if args.variant:
        comm = args.communicator or "tcp"
        variants = [tuple(v.split("=", 1)) + ({},) for v in args.variant]
        variants = [(n, comm, o, e) for n, o, e in variants]
    elif args.communicator == "tcp":
        variants = tcp
    elif args.communicator == "ucx":
        variants = ucx
    elif args.communicator:
        variants = [(args.communicator, args.communicator, "{}", {})]
    else:
        plugin_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.distopt))), "plugins")
        has_ucx = os.path.exists(os.path.join(plugin_dir, "libdistopt_ucx.so")) or any(
            os.path.exists(os.path.join(p, "libdistopt_ucx.so")) for p in args.plugin_path or [])
        variants = tcp + (ucx if has_ucx else [])
    base_anchors = anchors
    for world in args.nranks:
        anchors = list(base_anchors)
        if membw_exe and world == 2:
            anchors.append(("bound", lambda world, sizes: run_bound(membw_exe, world, sizes)))
            anchors.append(("bound-ab", lambda world, sizes: run_bound_ab(membw_exe, world, sizes)))
        # One list of runs per column (variants, then the anchors); each
        # repetition runs every column once, in the order of a Williams
        # design (run_order).
        runs = [[] for _ in range(len(variants) + len(anchors))]
        sizes = None
        for rep in range(max(1, args.repeat)):
            order = run_order(len(runs), rep)
            if sizes is None and order[0] >= len(variants):  # the anchors need distopt's sizes
                first = next(c for c in order if c < len(variants))
                order = [first] + [c for c in order if c != first]
            for c in order:
                if c < len(variants):
                    name, comm, opts, env = variants[c]
                    runs[c].append(run_distopt(args, world, comm, opts, env))
                    sizes = sizes or [r["bytes"] for r in runs[c][-1]]
                else:
                    runs[c].append(anchors[c - len(variants)][1](world, sizes))
        cols = [(variants[c][0], runs[c]) for c in range(len(variants))]
        desc = ", ".join("%s=%s %s%s" % (n, c, o, "".join(" %s=%s" % kv for kv in e.items())) for n, c, o, e in variants)
        anchor_desc = []
        if not args.no_gloo:
            anchor_desc.append("PyTorch %s gloo" % __import__("torch").__version__)
        if mpi_exe:
            anchor_desc.append(mpi_version() + " (btl self,vader)")
        if any(a[0] == "bound" for a in anchors):
            anchor_desc.append("the memory bound (copy rate of 2 processes / (%.1f B/B x 2))" % BYTES_PER_BYTE)
            anchor_desc.append("bound-ab (the memory bound's time plus one one-way latency between two "
                               "processes through a shared cache line)")
        print("# allreduce float32 sum, %d ranks on 127.0.0.1: distopt (%s) vs %s; busbw in "
              "GB/s, median (min-max) of %d interleaved runs" %
              (world, desc, " and ".join(anchor_desc) or "no anchor", len(runs[0])))
        anames = [a[0] for a in anchors]
        names = [name for name, _ in cols] + anames + [
            name + "/" + a for a in anames for name, _ in cols]
        widths = [max(20, len(n)) for n in names[:len(runs)]] + [max(10, len(n)) for n in names[len(runs):]]
        print("# %12s" % "size(B)" + "".join(" %*s" % (w, n) for w, n in zip(widths, names)))
        for i, nbytes in enumerate(sizes):
            per = [[r[i]["busbw_gbs"] for r in col] for col in runs]
            vals = ["%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v)) for v in per]
            for a in range(len(anchors)):
                ref = statistics.median(per[len(variants) + a])
                vals += ["%.2f" % (statistics.median(v) / ref) for v in per[:len(variants)]]
            print("  %12d" % nbytes + "".join(" %*s" % (w, v) for w, v in zip(widths, vals)))
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
