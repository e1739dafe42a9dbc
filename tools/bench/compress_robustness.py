#!/usr/bin/python3
"""How robust the lossy reducers are: final test accuracy of `distopt train`
(mlp, 2 ranks x 2 epochs, batch 256 per rank, the tests/compress job) for
every reducer configuration x seed x OpenBLAS kernel set, as a table.

    tools/bench/compress_robustness.py [--seeds 0,1,2] [--kernels Haswell,SkylakeX,auto]
        [--only topk,signsgd] [--before]

"auto" is OpenBLAS's own choice for this CPU (distopt's rule applies).
--before adds the configurations tests/compress used before the robustness study
(optimizer momentum 0.9 after compression, min_k 1), for comparison.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, reducer YAML, SGD lr, SGD momentum): what tests/compress trains.
CONFIGS = [
    ("topk 0.01, EF, momentum correction 0.9",
     "{name: topk, options: {ratio: 0.01, error_feedback: true, momentum: 0.9}}", 0.1, 0.0),
    ("signsgd, EF, momentum correction 0.9, lr 0.02",
     "{name: signsgd, options: {error_feedback: true, momentum: 0.9}}", 0.02, 0.0),
    ("randomk 0.01, EF, no momentum", "{name: randomk, options: {ratio: 0.01, error_feedback: true}}",
     0.1, 0.0),
]
BEFORE = [
    ("topk 0.01, EF, optimizer momentum 0.9, min_k 1 (before)",
     "{name: topk, options: {ratio: 0.01, error_feedback: true, min_k: 1}}", 0.1, 0.9),
    ("signsgd, EF, optimizer momentum 0.9, lr 0.02 (before)",
     "{name: signsgd, options: {error_feedback: true}}", 0.02, 0.9),
    ("randomk 0.01, EF, optimizer momentum 0.9 (before)",
     "{name: randomk, options: {ratio: 0.01, error_feedback: true, min_k: 1}}", 0.1, 0.9),
]


def train(a, reducer, lr, momentum, seed, kernels):
    with tempfile.TemporaryDirectory() as tmp:
        job, metrics = os.path.join(tmp, "job.yaml"), os.path.join(tmp, "m.jsonl")
        with open(job, "w") as f:
            f.write(f"plugins: {{paths: [{a.plugin_path}]}}\nworld: {{size: 2, timeout_s: 120}}\n"
                    f"communicator: {{name: tcp}}\nreducer: {reducer}\nalgorithm: {{name: allreduce}}\n"
                    f"optimizer: {{name: sgd, lr: {lr}, momentum: {momentum}}}\n"
                    f"train: {{model: mlp, epochs: 2, batch_size: 256, seed: {seed}, threads: 1, "
                    f"data_dir: {a.data}}}\n")
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "DISTOPT_BLAS_REEXEC")}
        if kernels != "auto":
            env["OPENBLAS_CORETYPE"] = kernels
        r = subprocess.run([a.distopt, "train", job, "--metrics", metrics], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env)
        if r.returncode != 0:
            sys.stderr.write(r.stdout)
            raise SystemExit(f"distopt train failed (exit {r.returncode})")
        with open(metrics) as f:
            return [json.loads(l) for l in f if '"summary"' in l][-1]["final_test_accuracy"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = os.path.join(ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"))
    ap.add_argument("--distopt", default=os.path.join(build, "bin/distopt"))
    ap.add_argument("--plugin-path", default=os.path.join(build, "plugins"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--kernels", default="Haswell,SkylakeX,auto")
    ap.add_argument("--only", default="")
    ap.add_argument("--before", action="store_true")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    kernels = a.kernels.split(",")
    confs = CONFIGS + (BEFORE if a.before else [])
    if a.only:
        confs = [c for c in confs if c[0].split()[0] in a.only.split(",")]
    cols = [(k, s) for k in kernels for s in seeds]
    print("final test accuracy, %; columns: kernel set / seed")
    print(f"{'configuration':58s} " + " ".join(f"{k[:4]}/{s}" for k, s in cols) + "    min  median")
    for label, reducer, lr, momentum in confs:
        accs = []
        for k, s in cols:
            accs.append(100 * train(a, reducer, lr, momentum, s, k))
            print(f"{label} {k} seed {s}: {accs[-1]:.2f}%", file=sys.stderr, flush=True)
        print(f"{label:58s} " + " ".join(f"{x:6.2f}" for x in accs)
              + f" {min(accs):6.2f} {statistics.median(accs):6.2f}", flush=True)


if __name__ == "__main__":
    main()
