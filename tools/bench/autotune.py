#!/usr/bin/python3
"""Autotuning the communication settings (`autotune:`) on a poorly configured job: the cnn
on Fashion-MNIST with a bucket per parameter (bucket_cap_mb 0.0001), 2 local
ranks, against the same job with fixed caps, measured in the same run. Rows
run interleaved, `--repeat` times; the table gives medians of samples/s over
the whole run (tuning steps included) and the cap autotuning chose.

    tools/bench/autotune.py [--repeat 3] [--ranks 2] [--max-steps 120]
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
    ("fixed 0.0001 MiB (a bucket per parameter)", "{bucket_cap_mb: 0.0001}", ""),
    ("fixed 25 MiB (the default)", "{bucket_cap_mb: 25}", ""),
    ("autotune from 0.0001 MiB", "{bucket_cap_mb: 0.0001}", "autotune: {steps: 10, trials: 4}\n"),
]


def job(ranks, reducer_options, extra, max_steps):
    return (f"world: {{size: {ranks}, timeout_s: 60}}\n"
            f"reducer: {{name: mean, options: {reducer_options}}}\n"
            "algorithm: {name: allreduce}\n"
            "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
            f"train: {{model: cnn, epochs: 1, batch_size: 64, seed: 0, max_steps: {max_steps}}}\n"
            + extra)


def run(cli, path, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    r = subprocess.run([cli, "train", path, "--metrics", metrics], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{path} failed:\n{r.stdout}\n{r.stderr}")
    summary = [json.loads(l) for l in open(metrics) if '"summary"' in l][-1]
    chosen = re.findall(r"-> (bucket_cap_mb [^(]*?) \(", r.stdout + r.stderr)
    return summary["samples_per_s"], chosen[-1] if chosen else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=120)
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/bin/distopt"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="distopt_autotune_")
    results = {name: [] for name, _, _ in ROWS}
    chosen = {name: set() for name, _, _ in ROWS}
    for _ in range(a.repeat):
        for name, opts, extra in ROWS:
            path = os.path.join(tmp, "job.yaml")
            with open(path, "w") as f:
                f.write(job(a.ranks, opts, extra, a.max_steps))
            sps, c = run(a.cli, path, os.path.join(tmp, "m.jsonl"))
            results[name].append(sps)
            chosen[name].add(c)
    base = statistics.median(results[ROWS[0][0]])
    print(f"# cnn, {a.ranks} ranks, batch 64 per rank, {a.max_steps} steps, "
          f"medians of {a.repeat}")
    print("| setting | samples/s | vs a bucket per parameter | setting chosen |")
    print("|---|---|---|---|")
    for name, _, _ in ROWS:
        m = statistics.median(results[name])
        print(f"| {name} | {m:.0f} | {m / base:.2f}x | {' / '.join(sorted(chosen[name]))} |")


if __name__ == "__main__":
    main()
