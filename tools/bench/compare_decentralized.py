#!/usr/bin/python3
"""Decentralized SGD and local SGD against allreduce on the same job (mlp on
Fashion-MNIST, SGD + momentum, batch 128 per rank), on 2 and 4 local ranks:
samples/s, bytes sent per rank per step, final test accuracy (of the mean
model for decentralized and local_sgd rows) and the consensus distance at
the end (local_sgd: after the last step, which need not be an average). Rows
run interleaved, `--repeat` times; the table gives medians.

With `--netns-rate RATE` (root; tools/netns/hosts.py) the same rows run
with one rank per network namespace, the namespaces joined by veth pairs
through a bridge and every link rate-limited with tc tbf in both directions
(e.g. 1gbit): the slowed link, where decentralized training is meant to
win. The table then adds the time per step, the part of it spent inside
opt.step() (communication backward did not hide, plus the update), the time
the bytes of a step take at the link rate (a floor on communication), the
`distopt bench comm` allreduce busbw over the same links, and the
point-to-point TCP bandwidth of one link, all measured in the same run.
With 4 or more ranks (an even number) each gossip row also gets its
anchor, measured in the same namespaces after the rows: plain TCP sockets
doing only that row's exchange with its bytes (tools/bench/gossip_sockets.py:
the ring's two neighbours one at a time, shift_one's rotating partner),
the mean ms of 20 rounds ("sockets ms"), and that time over the row's
ms/step ("of sockets"): how close the step comes to what the links give
plain sockets. "model ms" adds to the sockets' time the part of the row's
step spent outside opt.step() (forward, backward, data), measured in the
same run: the step of a gossip whose exchange ran exactly as fast as
plain sockets, with no update, mixing or codec, and with none of the
compute overlapping the exchange (with one bucket it cannot: the bucket
is ready only at the end of backward, and the next forward needs the
mixed parameters; low_precision's round needs the stepped ones). "of
model" is that over the row's ms/step. Where the model is above the link
floor / 0.9, 90% of the floor is out of reach on this machine unless the
compute overlaps the exchange.

    tools/bench/compare_decentralized.py [--repeat 3] [--epochs 2] [--ranks 2 4]
    tools/bench/compare_decentralized.py --netns-rate 1gbit [--ranks 2 4]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "netns"))
import hosts as netns_hosts  # noqa: E402  (tools/netns/hosts.py)
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import gossip_sockets  # noqa: E402  (the plain-socket anchor of the gossip rows)
ROWS = [
    ("allreduce", "{name: allreduce}"),
    ("decentralized ring", "{name: decentralized, options: {topology: ring}}"),
    ("decentralized shift_one", "{name: decentralized, options: {topology: shift_one}}"),
    ("decentralized ring, no overlap",
     "{name: decentralized, options: {topology: ring, overlap: false}}"),
    ("decentralized low_precision",
     "{name: decentralized, options: {topology: ring, low_precision: true}}"),
    ("local_sgd period 4", "{name: local_sgd, options: {period: 4}}"),
]


# The gossip rows' exchange pattern for the plain-socket anchor
# (gossip_sockets.py) and the messages a rank sends per round in it: the
# ring's two neighbours one at a time (link_schedule auto across hosts),
# shift_one's one partner.
ANCHOR = {
    "decentralized ring": ("ring_one_at_a_time", 2),
    "decentralized shift_one": ("shift_one", 1),
    "decentralized ring, no overlap": ("ring_one_at_a_time", 2),
    "decentralized low_precision": ("ring_one_at_a_time", 2),
}
ANCHOR_ROUNDS = 20


def job(ranks, algorithm, epochs, bucket_cap_mb=None):
    reducer = ("{name: mean}" if bucket_cap_mb is None else
               f"{{name: mean, options: {{bucket_cap_mb: {bucket_cap_mb}}}}}")
    return (f"world: {{size: {ranks}, timeout_s: 60}}\n"
            f"algorithm: {algorithm}\nreducer: {reducer}\n"
            "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
            f"train: {{model: mlp, epochs: {epochs}, batch_size: 128, seed: 0, threads: 1}}\n")


def run(cli, path, metrics, hosts=None):
    if os.path.exists(metrics):
        os.remove(metrics)
    if hosts is None:
        r = subprocess.run([cli, "train", path, "--metrics", metrics], capture_output=True,
                           text=True)
        if r.returncode != 0:
            sys.exit(f"{path} failed:\n{r.stdout}\n{r.stderr}")
    else:
        run_in_namespaces(hosts, [cli, "train", path, "--metrics", metrics], path)
    events = [json.loads(l) for l in open(metrics)]
    summary = [e for e in events if e.get("event") == "summary"][-1]
    epochs = [e for e in events if e.get("event") == "epoch"]
    return {
        "sps": summary["samples_per_s"],
        "bytes_step": summary["bytes_sent_per_rank"][0] / summary["steps"],
        "acc": summary["final_test_accuracy"],
        "consensus": epochs[-1].get("consensus_distance", 0.0),
        # ms per step inside opt.step() (communication not hidden, and the update), mean over ranks
        "wait_ms": 1e3 * statistics.mean(summary.get("step_seconds_per_rank", [0.0])) /
                   summary["steps"],
    }


def run_in_namespaces(hosts, argv, what, timeout_s=1800):
    """One rank per namespace (hosts.Hosts.launch); exits with rank 0's output on failure."""
    out_dir = tempfile.mkdtemp(prefix="distopt_dbench_ns_")
    procs, outs = hosts.launch(argv, out_dir)
    codes, _ = netns_hosts.wait_all(procs, timeout_s)
    if codes != [0] * len(procs):
        sys.exit(f"{what} failed in namespaces (exit codes {codes}):\n" + open(outs[0]).read())
    return open(outs[0]).read()


def busbw(cli, hosts):
    """`distopt bench comm` allreduce over the namespaces: {bytes: busbw GB/s}."""
    out = run_in_namespaces(hosts, [cli, "bench", "comm", "--min-bytes", "1M", "--max-bytes",
                                    "16M", "--options", "{shm: false}"], "bench comm")
    rows = [l.split() for l in out.splitlines() if l.strip() and not l.startswith("#")]
    # size, count, median time, min..max, algbw, busbw
    return {int(r[0]): float(r[5]) for r in rows if len(r) == 6 and r[0].isdigit()}


P2P = r"""
import socket, sys, time
if sys.argv[1] == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], 5201)); s.listen(1); c, _ = s.accept(); n, t0 = 0, None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        t0 = t0 or time.time(); n += len(b)
    print(n / (time.time() - t0) / 1e6)
else:
    c = socket.create_connection((sys.argv[2], 5201)); buf = b"x" * (1 << 20); t = time.time()
    while time.time() - t < 3: c.sendall(buf)
"""


def p2p_mbs(hosts):
    """TCP bandwidth host 1 -> host 0 over the shaped link, MB/s (one stream, 3 s)."""
    rx = subprocess.Popen(hosts.argv(0, [sys.executable, "-c", P2P, "recv", hosts.addr[0]]),
                          stdout=subprocess.PIPE, text=True)
    for _ in range(50):
        if subprocess.run(hosts.argv(1, [sys.executable, "-c", P2P, "send", hosts.addr[0]]),
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.1)  # the receiver is not listening yet
    return float(rx.communicate(timeout=30)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/bin/distopt"))
    ap.add_argument("--netns-rate", metavar="RATE",
                    help="run the rows with one rank per network namespace over links "
                         "rate-limited with tc tbf to RATE (e.g. 1gbit); needs root")
    ap.add_argument("--bucket-cap-mb", type=float, metavar="MB",
                    help="reducer bucket_cap_mb for every row (default: 25, one bucket for "
                         "the mlp's 2.1 MB)")
    ap.add_argument("--rows", metavar="REGEX",
                    help="only the rows whose label matches REGEX (e.g. 'allreduce|shift_one'); "
                         "leaves out the busbw line")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="distopt_dbench_")
    if a.netns_rate:
        why = netns_hosts.skip_reason()
        if why:
            sys.exit(f"--netns-rate: {why}")
        link_bytes_s = netns_hosts.rate_bits(a.netns_rate) / 8
        print(f"# one rank per network namespace, veth + bridge, tc tbf {a.netns_rate} per link "
              "and direction; rank 0 prints, medians of --repeat runs")
    print(f"{'ranks':>5}  {'algorithm':<32}{'samples/s':>10}{'MB/step/rank':>14}"
          f"{'accuracy %':>11}{'consensus':>11}" +
          (f"{'ms/step':>9}{'in step':>9}{'link ms':>9}{'sockets ms':>11}{'of sockets':>11}"
           f"{'model ms':>10}{'of model':>10}" if a.netns_rate else ""))
    for ranks in a.ranks:
        if a.netns_rate:
            with netns_hosts.Hosts(ranks, rate=a.netns_rate) as hosts:
                for note in hosts.notes:
                    print(f"# {note}")
                table(a, ranks, tmp, hosts, link_bytes_s)
                if a.rows:
                    continue
                bw = busbw(a.cli, hosts)
                print(f"# {ranks} ranks: bench comm allreduce busbw (shm off) "
                      + ", ".join(f"{b >> 20} MiB {v:.3f} GB/s" for b, v in sorted(bw.items()))
                      + f"; one link point-to-point {p2p_mbs(hosts):.0f} MB/s", flush=True)
        else:
            table(a, ranks, tmp)


def selected(a, ranks):
    """(index, label, algorithm) of the rows this run measures on `ranks` ranks."""
    return [(i, label, alg) for i, (label, alg) in enumerate(ROWS)
            if not ("shift_one" in label and ranks % 2)
            and not (a.rows and not re.search(a.rows, label))]


def table(a, ranks, tmp, hosts=None, link_bytes_s=None):
    """The rows on `ranks` ranks (in `hosts`' namespaces when given), printed."""
    results = {label: [] for label, _ in ROWS}
    sockets_ms = {}  # (pattern, bytes per message): the anchor's mean ms per round
    verdicts = []  # the 90%-of-floor target against the model, per modelled row
    for _ in range(a.repeat):
        for i, label, alg in selected(a, ranks):
            path = os.path.join(tmp, f"r{ranks}_{i}.yaml")
            open(path, "w").write(job(ranks, alg, a.epochs, a.bucket_cap_mb))
            results[label].append(run(a.cli, path, os.path.join(tmp, "m.jsonl"), hosts))
    for label, _ in ROWS:
        rs = results[label]
        if not rs:
            continue
        med = lambda k: statistics.median(r[k] for r in rs)
        extra = ""
        if hosts:  # a step's time, the part spent in step(), its bytes' time at the link rate
            step_ms = 1e3 * 128 * ranks / med("sps")
            extra = (f"{step_ms:>9.1f}{med('wait_ms'):>9.1f}"
                     f"{1e3 * med('bytes_step') / link_bytes_s:>9.1f}")
            # The anchor: plain sockets doing only this row's exchange, with
            # its bytes, in the same namespaces (mean round time).
            anchor = ANCHOR.get(label) if ranks >= 4 and ranks % 2 == 0 else None
            if anchor:
                pattern, messages = anchor
                key = (pattern, round(med("bytes_step") / messages))
                if key not in sockets_ms:
                    sockets_ms[key] = statistics.mean(
                        gossip_sockets.measure(hosts, pattern, key[1], ANCHOR_ROUNDS))
                extra += f"{sockets_ms[key]:>11.1f}{sockets_ms[key] / step_ms:>11.0%}"
                # The model: the sockets' exchange plus the compute outside step().
                model = sockets_ms[key] + step_ms - med("wait_ms")
                extra += f"{model:>10.1f}{model / step_ms:>10.0%}"
                target = 1e3 * med("bytes_step") / link_bytes_s / 0.9
                verdicts.append(
                    f"# {label}: 90% of the link floor is a step of {target:.1f} ms, the "
                    f"model's is {model:.1f} ms: " +
                    ("within reach" if model <= target else
                     "out of reach unless the compute overlaps the exchange"))
        print(f"{ranks:>5}  {label:<32}{med('sps'):>10.0f}{med('bytes_step') / 1e6:>14.2f}"
              f"{100 * med('acc'):>11.2f}{med('consensus'):>11.3g}" + extra, flush=True)
    for v in verdicts:
        print(v, flush=True)

if __name__ == "__main__":
    main()
