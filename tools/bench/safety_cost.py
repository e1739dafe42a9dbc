#!/usr/bin/python3
"""What the DDP-style safety features cost per step on the quickstart job
(share/distopt/examples/allreduce-sgd.yaml: mlp, 2 ranks, batch 256 per rank):
`join: {enabled: true}` (a 4-byte allreduce at the start of every step) and
the collective mismatch check (`world.collective_check_s`, on by default),
against both off, in the same run. Rows are interleaved so machine noise spreads over all of them; the
table gives the median samples/s and the mean step time (optim.step_seconds
is not printed by train, so: global batch / samples/s).

    tools/bench/safety_cost.py [--repeat 5] [--epochs 1]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "share/distopt/examples/allreduce-sgd.yaml")
VARIANTS = [
    ("mismatch check (default)", ""),
    ("mismatch check + join", "join: {enabled: true}\n"),
    ("join only", "  collective_check_s: 0\njoin: {enabled: true}\n"),
    ("both off (baseline)", "  collective_check_s: 0\n"),
]

def job_text(extra):
    text = open(JOB).read()
    world_lines = "".join(l + "\n" for l in extra.splitlines() if l.startswith("  "))
    top_lines = "".join(l + "\n" for l in extra.splitlines() if not l.startswith("  "))
    text = text.replace("  timeout_s: 60\n", "  timeout_s: 60\n" + world_lines)
    return text + top_lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/bin/distopt"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="distopt_safety_")
    files = []
    for i, (_, extra) in enumerate(VARIANTS):
        path = os.path.join(tmp, f"v{i}.yaml")
        with open(path, "w") as f:
            f.write(job_text(extra))
        files.append(path)
    sps = {label: [] for label, _ in VARIANTS}
    for rep in range(a.repeat):
        for (label, _), path in zip(VARIANTS, files):
            out = subprocess.run([a.cli, "train", path, "--epochs", str(a.epochs)],
                                 capture_output=True, text=True, check=True).stdout
            m = re.search(r"samples/s \(global\): (\d+)", out)
            sps[label].append(float(m.group(1)))
            print(f"  repeat {rep + 1}: {label}: {m.group(1)} samples/s", file=sys.stderr)
    base = statistics.median(sps[VARIANTS[-1][0]])
    print(f"| variant | samples/s (median of {a.repeat}) | step (ms, global batch 512) | vs baseline |")
    print("|---|---:|---:|---:|")
    for label, _ in VARIANTS:
        med = statistics.median(sps[label])
        print(f"| {label} | {med:,.0f} | {512 / med * 1000:.2f} | {med / base:.3f}x |")


if __name__ == "__main__":
    main()
