#!/usr/bin/python3
"""Compare distopt's gradient reducers side by side on one job, in one run.

Runs `distopt train` (mlp on Fashion-MNIST, 2 ranks on 127.0.0.1, batch 256
per rank, SGD, allreduce algorithm, tcp communicator) once per reducer:
mean, fp16, bf16, signsgd (error feedback), topk 0.01 (error feedback),
randomk 0.01 (error feedback), and powersgd rank 4 when a `powersgd` reducer
is in the plugin directory (reducers the plugin directory lacks are skipped
with a message). Learning rate and where the momentum lives: see REDUCERS.
Prints one table:

  bytes/step/rank  bytes the reducer put on the wire per step and rank
                   (its own bytes_sent count over the run / steps)
  vs mean          compression ratio: mean's bytes per step / this one's
  step ms          training time per step (test evaluation excluded)
  samples/s        global training throughput
  test acc         test accuracy after the last epoch (10k images)

    tools/bench/compare_reducers.py [--distopt build/bin/distopt]
        [--plugin-path build/plugins] [--epochs 2] [--threads 1]
        [--data /usr/share/datasets/fashion-mnist] [--only topk,mean]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (label, reducer YAML, SGD learning rate, SGD momentum): the configurations
# tests/compress trains. Sign methods take a smaller step (Bernstein et al.
# tune signSGD's lr separately). signsgd and topk carry the momentum
# themselves (DGC momentum correction, the optimizer runs without); randomk
# trains only without momentum (share/doc/distopt/BENCHMARKS.md "Compression robustness").
REDUCERS = [
    ("mean", "{name: mean}", 0.1, 0.9),
    ("fp16", "{name: fp16}", 0.1, 0.9),
    ("bf16", "{name: bf16}", 0.1, 0.9),
    ("signsgd (EF, momentum corr.) lr 0.02",
     "{name: signsgd, options: {error_feedback: true, momentum: 0.9}}", 0.02, 0.0),
    ("topk 0.01 (EF, momentum corr.)", "{name: topk, options: {ratio: 0.01, momentum: 0.9}}", 0.1, 0.0),
    ("randomk 0.01 (EF, no momentum)", "{name: randomk, options: {ratio: 0.01}}", 0.1, 0.0),
    ("powersgd rank 4", "{name: powersgd, options: {rank: 4}}", 0.1, 0.9),
]


def available_reducers(distopt, plugin_path):
    """Names of the reducers `distopt plugins` discovers (empty set if it fails)."""
    argv = [distopt, "plugins"]
    for p in plugin_path:
        argv += ["--plugin-path", p]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    names = set()
    for line in r.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "reducer":
            names.add(words[1])
    return names


def run(a, label, reducer_yaml, lr, momentum, tmp):
    job = os.path.join(tmp, "job.yaml")
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    with open(job, "w") as f:
        f.write("plugins: {paths: [%s]}\n" % ", ".join(os.path.abspath(p) for p in a.plugin_path))
        f.write("world: {size: %d, timeout_s: 120}\n" % a.world)
        f.write("communicator: {name: tcp}\n")
        f.write("reducer: %s\n" % reducer_yaml)
        f.write("algorithm: {name: allreduce}\n")
        f.write("optimizer: {name: sgd, lr: %g, momentum: %g}\n" % (lr, momentum))
        f.write("train: {model: mlp, epochs: %d, batch_size: %d, seed: 0, threads: %d}\n"
                % (a.epochs, a.batch, a.threads))
    argv = [a.distopt, "train", job, "--metrics", metrics, "--data", a.data]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
    if r.returncode != 0:
        sys.stderr.write(r.stdout)
        raise SystemExit(f"{label}: distopt train failed (exit code {r.returncode})")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    s = [m for m in rows if m.get("event") == "summary"][-1]
    steps = s["steps"]
    return {
        "label": label,
        "bytes_per_step": sum(s["bytes_sent_per_rank"]) / len(s["bytes_sent_per_rank"]) / steps,
        "plain_per_step": s["bytes_sent_plain_allreduce_per_rank"][0] / steps,
        "step_ms": 1000.0 * s["train_time_s"] / steps,
        "samples_per_s": s["samples_per_s"],
        "accuracy": s["final_test_accuracy"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--distopt", default=os.path.join(ROOT, "build", "bin", "distopt"))
    ap.add_argument("--plugin-path", action="append", default=None)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--only", default="", help="comma-separated reducer names to run (default: all)")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    a = ap.parse_args()
    if a.plugin_path is None:
        a.plugin_path = [os.path.join(ROOT, "build", "plugins")]
    have = available_reducers(a.distopt, a.plugin_path)
    only = set(x for x in a.only.split(",") if x)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, yaml, lr, momentum in REDUCERS:
            name = yaml.split("name: ")[1].split(",")[0].split("}")[0].strip()
            if only and name not in only:
                continue
            if have and name not in have:
                print(f"skipping {label}: no reducer '{name}' in {a.plugin_path}", file=sys.stderr)
                continue
            print(f"running {label} ...", file=sys.stderr, flush=True)
            rows.append(run(a, label, yaml, lr, momentum, tmp))
    mean = next((r for r in rows if r["label"] == "mean"), None)
    base = mean["bytes_per_step"] if mean else (rows[0]["plain_per_step"] if rows else 0)
    print(f"mlp on Fashion-MNIST, {a.world} ranks x {a.epochs} epochs, batch {a.batch}/rank, "
          f"{a.threads} thread(s)/rank; plain allreduce: {base:,.0f} bytes/step/rank")
    print(f"{'reducer':20s} {'bytes/step/rank':>16s} {'vs mean':>9s} {'step ms':>8s} {'samples/s':>10s} {'test acc':>9s}")
    for r in rows:
        ratio = base / r["bytes_per_step"] if r["bytes_per_step"] > 0 else float("inf")
        print(f"{r['label']:20s} {r['bytes_per_step']:16,.0f} {ratio:8.1f}x {r['step_ms']:8.2f} "
              f"{r['samples_per_s']:10.0f} {100 * r['accuracy']:8.2f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
