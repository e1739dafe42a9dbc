#!/usr/bin/python3
"""Decentralized SGD and local SGD against allreduce on the same job (mlp on
Fashion-MNIST, SGD + momentum, batch 128 per rank), on 2 and 4 local ranks:
samples/s, bytes sent per rank per step, final test accuracy (of the mean
model for decentralized and local_sgd rows) and the consensus distance at
the end (local_sgd: after the last step, which need not be an average). Rows
run interleaved, `--repeat` times; the table gives medians.

Loopback only: the slowed-link rows (network namespaces joined by veth,
rate-limited with tc tbf), where decentralized training is meant to win,
are not written yet.

    tools/bench/compare_decentralized.py [--repeat 3] [--epochs 2] [--ranks 2 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def job(ranks, algorithm, epochs):
    return (f"world: {{size: {ranks}, timeout_s: 60}}\n"
            f"algorithm: {algorithm}\nreducer: {{name: mean}}\n"
            "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
            f"train: {{model: mlp, epochs: {epochs}, batch_size: 128, seed: 0, threads: 1}}\n")


def run(cli, path, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    r = subprocess.run([cli, "train", path, "--metrics", metrics], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{path} failed:\n{r.stdout}\n{r.stderr}")
    events = [json.loads(l) for l in open(metrics)]
    summary = [e for e in events if e.get("event") == "summary"][-1]
    epochs = [e for e in events if e.get("event") == "epoch"]
    return {
        "sps": summary["samples_per_s"],
        "bytes_step": summary["bytes_sent_per_rank"][0] / summary["steps"],
        "acc": summary["final_test_accuracy"],
        "consensus": epochs[-1].get("consensus_distance", 0.0),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/bin/distopt"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="distopt_dbench_")
    print(f"{'ranks':>5}  {'algorithm':<32}{'samples/s':>10}{'MB/step/rank':>14}"
          f"{'accuracy %':>11}{'consensus':>11}")
    for ranks in a.ranks:
        results = {label: [] for label, _ in ROWS}
        for _ in range(a.repeat):
            for i, (label, alg) in enumerate(ROWS):
                if "shift_one" in label and ranks % 2:
                    continue
                path = os.path.join(tmp, f"r{ranks}_{i}.yaml")
                open(path, "w").write(job(ranks, alg, a.epochs))
                results[label].append(run(a.cli, path, os.path.join(tmp, "m.jsonl")))
        for label, _ in ROWS:
            rs = results[label]
            if not rs:
                continue
            med = lambda k: statistics.median(r[k] for r in rs)
            print(f"{ranks:>5}  {label:<32}{med('sps'):>10.0f}{med('bytes_step') / 1e6:>14.2f}"
                  f"{100 * med('acc'):>11.2f}{med('consensus'):>11.3g}")


if __name__ == "__main__":
    main()
