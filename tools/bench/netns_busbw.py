#!/usr/bin/python3
"""Allreduce busbw across network namespaces against the link's own
point-to-point bandwidth, in one run (`tcp` and `ucx` with
UCX_TLS=tcp within 70% of the veth point-to-point bandwidth).

For each world size and link (unlimited, and each `--rate`, tc tbf in both
directions, tools/netns/hosts.py), on N namespaces joined by veth pairs
through a bridge:
  1. iperf3, host 1 -> host 0, one TCP stream for `--seconds` s, before
     and after the benches (the column is their mean): the one-direction
     point-to-point rate; and both directions at once, per direction (what
     a ring asks of each link; on an unshaped veth the CPU is the limit);
  2. `distopt bench comm` allreduce, one rank per namespace (rendezvous on
     host 0, DISTOPT_BIND_ADDRESS each host's address), with `tcp` (its
     shared memory is off across namespaces by construction) and `ucx` with
     UCX_TLS=tcp, at `--sizes`.
busbw = algbw * 2(n-1)/n, so a 2-rank allreduce moves 1x the data each
way: compare it with the one-direction rate (the ratio columns). Rows of
one link come from one set of namespaces, measured one after the other.

    sudo tools/bench/netns_busbw.py [-n 2 3] [--rate 1gbit] [--sizes 1M 16M 64M]

The ranks inherit the environment, so other UCX_* variables reach ucx
(e.g. UCX_RNDV_THRESH=inf: eager protocols only). Needs root and
iproute2; without iperf3 (apt-get install iperf3) the point-to-point
columns say n/a; without the ucx plugin its columns do.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "netns"))
import hosts as netns_hosts  # noqa: E402  (tools/netns/hosts.py)

COMMS = [("tcp", "tcp", []), ("ucx", "ucx", ["env", "UCX_TLS=tcp"])]
IPERF_PORT = 5201  # the namespaces are fresh: nothing else listens there


def parse_bytes(s):
    """'16M' -> 16 MiB, '4K' -> 4096 (as `distopt bench comm` reads them)."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper())
    return int(float(s[:-1]) * mult) if mult else int(s)


def iperf3(hosts, seconds, bidir=False):
    """TCP bandwidth host 1 -> host 0 (iperf3, one stream), GB/s received;
    bidir: both directions at once, the mean of the two. None (and a reason
    on stderr) when iperf3 fails."""
    server = subprocess.Popen(hosts.argv(0, ["iperf3", "-s", "-1", "-B", hosts.addr[0], "-p",
                                             str(IPERF_PORT)]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cmd = ["iperf3", "-c", hosts.addr[0], "-p", str(IPERF_PORT), "-t", str(seconds), "-J"]
    cmd += ["--bidir"] if bidir else []
    try:
        for _ in range(50):  # until the server listens
            r = subprocess.run(hosts.argv(1, cmd), capture_output=True, text=True,
                               timeout=seconds + 30)
            try:
                out = json.loads(r.stdout)
            except ValueError:
                out = {"error": r.stderr.strip() or r.stdout.strip() or "no output"}
            end = out.get("end", {})
            if r.returncode == 0 and "error" not in out and "sum_received" in end:
                if bidir:
                    return (end["sum_received"]["bits_per_second"] +
                            end["sum_received_bidir_reverse"]["bits_per_second"]) / 2 / 8e9
                return end["sum_received"]["bits_per_second"] / 8e9
            if "connect" not in out.get("error", "") or server.poll() is not None:
                print(f"# iperf3 failed: {out.get('error', r.stderr.strip())}", file=sys.stderr)
                return None
            time.sleep(0.1)
        print("# iperf3: the server never listened", file=sys.stderr)
        return None
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def busbw(hosts, cli, comm, prefix, sizes, plugin_path, timeout_s):
    """`distopt bench comm` allreduce, one rank per namespace: {bytes: busbw
    GB/s} at `sizes`, or None (rank 0's output on stderr) on failure."""
    out_dir = tempfile.mkdtemp(prefix="distopt_nsbw_")
    js = os.path.join(out_dir, "rows.json")
    argv = prefix + [cli, "bench", "comm", "--communicator", comm, "--op", "allreduce",
                     "--min-bytes", str(min(sizes)), "--max-bytes", str(max(sizes)), "--json", js]
    for p in plugin_path:
        argv += ["--plugin-path", p]
    procs, outs = hosts.launch(argv, out_dir)
    codes, _ = netns_hosts.wait_all(procs, timeout_s)
    if codes != [0] * len(procs) or not os.path.exists(js):
        print(f"# {comm} bench comm failed in namespaces (exit codes {codes}; None: killed "
              f"after {timeout_s} s):\n" + open(outs[0]).read(), file=sys.stderr)
        return None
    rows = json.load(open(js))["rows"]
    out = {}
    for size in sizes:  # bench comm rounds the count to a multiple of the world size
        near = min(rows, key=lambda r: abs(r["bytes"] - size), default=None)
        if near and abs(near["bytes"] - size) <= 0.01 * size:
            out[size] = near["busbw_gbs"]
        else:
            print(f"# {comm}: no bench comm row near {size} bytes", file=sys.stderr)
    return out


def has_plugin(cli, name, plugin_path):
    libs = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(cli))), "plugins")]
    return any(os.path.exists(os.path.join(d, f"libdistopt_{name}.so")) for d in libs + plugin_path)


def fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def measure(a, n, rate, have_iperf, comms):
    """The table rows of one world size and link: one set of namespaces."""
    with netns_hosts.Hosts(n, rate=rate) as hosts:
        for note in hosts.notes:
            print(f"# {note}")
        before = iperf3(hosts, a.seconds) if have_iperf else None
        bidir = iperf3(hosts, a.seconds, bidir=True) if have_iperf and a.bidir else None
        bw = {name: busbw(hosts, a.cli, comm, prefix, a.sizes, a.plugin_path, a.timeout)
              if ok else None for (name, comm, prefix), ok in comms}
        after = iperf3(hosts, a.seconds) if have_iperf else None
    # The shared machine's load moves the unshaped rate: measure it around the benches.
    got = [x for x in (before, after) if x is not None]
    p2p = sum(got) / len(got) if got else None
    if len(got) == 2:
        print(f"# {rate or 'unlimited'}, n={n}: iperf3 before {before:.3f}, after {after:.3f} GB/s")
    rows = []
    for size in a.sizes:
        got = {k: (v or {}).get(size) for k, v in bw.items()}
        rows.append([rate or "unlimited", n, f"{size >> 20} MiB" if size >= 1 << 20 else
                     f"{size >> 10} KiB", p2p, bidir, got["tcp"], got["ucx"],
                     ratio(got["tcp"], p2p), ratio(got["ucx"], p2p)])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, nargs="+", default=[2], help="world sizes (namespaces)")
    ap.add_argument("--rate", nargs="+", default=["unlimited", "1gbit"],
                    help="links: 'unlimited' or a tc rate (1gbit, 100mbit)")
    ap.add_argument("--sizes", nargs="+", default=["1M", "16M", "64M"], help="allreduce sizes")
    ap.add_argument("--seconds", type=int, default=5, help="iperf3 duration")
    ap.add_argument("--no-bidir", dest="bidir", action="store_false",
                    help="skip the iperf3 run in both directions at once")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/bin/distopt"))
    ap.add_argument("-P", "--plugin-path", action="append", default=[])
    ap.add_argument("--timeout", type=int, default=600, help="seconds per bench comm run")
    a = ap.parse_args()
    a.sizes = sorted({parse_bytes(s) for s in a.sizes})
    why = netns_hosts.skip_reason()
    if why:
        sys.exit(f"netns_busbw: {why}")
    if not os.access(a.cli, os.X_OK):
        sys.exit(f"netns_busbw: {a.cli} is not built (tools/build.sh)")
    have_iperf = shutil.which("iperf3") is not None
    if not have_iperf:
        print("# iperf3 is not installed (apt-get install iperf3): point-to-point and ratio "
              "columns are n/a")
    comms = [(c, has_plugin(a.cli, c[1], a.plugin_path)) for c in COMMS]
    for (name, comm, _), ok in comms:
        if not ok:
            print(f"# no {comm} plugin (libdistopt_{comm}.so) next to {a.cli}: {name} is n/a")
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"iperf3 {a.seconds} s host 1 -> 0 (mean of before and after); ucx with UCX_TLS=tcp; "
          "busbw = algbw * 2(n-1)/n")
    head = ["link", "n", "size", "iperf3 GB/s", "bidir GB/s", "tcp busbw", "ucx busbw",
            "tcp/iperf3", "ucx/iperf3"]
    print(f"{head[0]:<10}{head[1]:>3}{head[2]:>8}" + "".join(f"{h:>12}" for h in head[3:]))
    table = []
    for n in a.n:
        for rate in a.rate:
            for r in measure(a, n, None if rate == "unlimited" else rate, have_iperf, comms):
                table.append(r)
                print(f"{r[0]:<10}{r[1]:>3}{r[2]:>8}" +
                      "".join(f"{fmt(x):>12}" for x in r[3:7]) +
                      "".join(f"{fmt(x, '.0%'):>12}" for x in r[7:]), flush=True)
    print(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in table:
        print("| " + " | ".join([str(r[0]), str(r[1]), r[2]] + [fmt(x) for x in r[3:7]] +
                                [fmt(x, ".0%") for x in r[7:]]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
