#!/usr/bin/python3
"""Flat `mean` against the `hierarchical` reducer (ring, leader, leader with
an inner powersgd) on the same job (mlp on Fashion-MNIST, SGD + momentum,
batch 128 per rank), 4 local ranks made 2 nodes x 2 ranks with
DISTOPT_NODE_ID=a,a,b,b: samples/s, bytes sent per rank per step within
the node and across nodes, and final test accuracy. Rows run interleaved,
`--repeat` times; the table gives medians.

The hierarchical rows' bytes are what the reducer counts (the ring model,
equal to tcp's socket bytes: tests/hierarchical/reduce_test.cpp). The flat
row's split is the ring model of a flat ring 0->1->2->3->0 over that layout
(ranks 1 and 3 send everything across nodes): on one host `tcp` reduces over
shared memory instead, so all rows share one memory bus and samples/s says
what the extra steps cost, not what a slow link between nodes would save.
--no-shm sends everything over tcp's loopback sockets.

    tools/bench/compare_hierarchical.py [--repeat 3] [--epochs 2] [--no-shm]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = [
    ("mean (flat ring)", "{name: mean}"),
    ("hierarchical ring", "{name: hierarchical, options: {variant: ring}}"),
    ("hierarchical leader", "{name: hierarchical, options: {variant: leader}}"),
    ("hierarchical leader + powersgd r4",
     "{name: hierarchical, options: {variant: leader}, "
     "inner: {name: powersgd, options: {rank: 4}}}"),
]
NODES = "a,a,b,b"
LINE = re.compile(r"rank (\d+) \(node \d+, local rank \d+ of \d+\): \d+ reductions, "
                  r"(\d+) bytes sent within the node, (\d+) to other nodes")


def job(reducer, epochs, shm):
    comm = "{name: tcp}" if shm else "{name: tcp, options: {shm: false}}"
    return (f"world: {{size: 4, timeout_s: 60}}\ncommunicator: {comm}\n"
            f"reducer: {reducer}\nalgorithm: {{name: allreduce}}\n"
            "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
            f"train: {{model: mlp, epochs: {epochs}, batch_size: 128, seed: 0, threads: 1}}\n")


def run(cli, path, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ, DISTOPT_NODE_ID=NODES)
    r = subprocess.run([cli, "train", path, "--metrics", metrics], capture_output=True,
                       text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{path} failed:\n{r.stdout}\n{r.stderr}")
    events = [json.loads(l) for l in open(metrics)]
    summary = [e for e in events if e.get("event") == "summary"][-1]
    steps = summary["steps"]
    sent = summary["bytes_sent_per_rank"]
    per_rank = {int(m.group(1)): (int(m.group(2)), int(m.group(3)))
                for m in LINE.finditer(r.stdout + r.stderr)}
    if per_rank:
        intra = statistics.mean(v[0] for v in per_rank.values()) / steps
        inter = statistics.mean(v[1] for v in per_rank.values()) / steps
    else:
        # Flat ring 0->1->2->3->0 on nodes a,a,b,b: ranks 1 and 3 send across.
        total = statistics.mean(sent) / steps
        inter = sum(sent[r] for r in (1, 3)) / len(sent) / steps
        intra = total - inter
    return {"sps": summary["samples_per_s"], "total": statistics.mean(sent) / steps,
            "intra": intra, "inter": inter, "acc": summary["final_test_accuracy"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--no-shm", action="store_true", help="tcp over loopback sockets only")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/bin/distopt"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="distopt_hbench_")
    results = {label: [] for label, _ in ROWS}
    for _ in range(a.repeat):
        for i, (label, reducer) in enumerate(ROWS):
            path = os.path.join(tmp, f"job{i}.yaml")
            open(path, "w").write(job(reducer, a.epochs, not a.no_shm))
            results[label].append(run(a.cli, path, os.path.join(tmp, "m.jsonl")))
    print(f"4 ranks as 2 nodes x 2 ({NODES}), {'shared memory' if not a.no_shm else 'tcp sockets'}"
          f", {a.epochs} epochs, median of {a.repeat}")
    print(f"{'reducer':<36}{'samples/s':>10}{'KB/step/rank':>13}{'within node':>12}"
          f"{'across nodes':>13}{'accuracy %':>11}")
    for label, _ in ROWS:
        rs = results[label]
        med = lambda k: statistics.median(r[k] for r in rs)
        print(f"{label:<36}{med('sps'):>10.0f}{med('total') / 1e3:>13.1f}"
              f"{med('intra') / 1e3:>12.1f}{med('inter') / 1e3:>13.1f}{100 * med('acc'):>11.2f}")


if __name__ == "__main__":
    main()
