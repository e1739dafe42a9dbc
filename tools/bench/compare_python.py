#!/usr/bin/python3
"""distopt's Python optimizers against PyTorch DDP (gloo) and `distopt train`, in one run.

The same mlp (784-512-256-10) on the same Fashion-MNIST batches (compare_ddp.py's
loop: the seeded permutation, slice `rank` of each global batch), the same ranks
on 127.0.0.1, per-rank batch, epochs, SGD settings and threads per rank. Each
column is a separate set of processes; the training steps are timed (evaluation
excluded), `--repeat` times in turn, and the table gives the median samples/s
with its min-max and the last run's test accuracy:

- PyTorch DDP over gloo, and the same DDP script over the "distopt" backend;
- `distopt.DistributedOptimizer` with allreduce, and `distopt.ZeroRedundancyOptimizer`
  (zero stage 1), in the same PyTorch loop (a gloo group only evaluates);
- `distopt train` on the same job.

    /usr/bin/python3 tools/bench/compare_python.py [--world 2] [--epochs 2]
        [--repeat 3] [--batch 256] [--threads N]

Needs Debian's python3-torch and the build's Python package (build/python).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_ddp as cd  # noqa: E402


def python_worker(a, kind):
    """One rank of a distopt Python optimizer (RANK/WORLD_SIZE/MASTER_* for the
    evaluation's gloo group; DISTOPT_* for distopt's own rendezvous)."""
    import torch
    import torch.distributed as dist
    sys.path.insert(0, a.python_path)
    import distopt

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")  # evaluation only (not timed)
    torch.manual_seed(a.seed)
    model = cd.mlp()
    job = {"communicator": "tcp", "reducer": "mean", "plugins": {"paths": a.plugin_path},
           "train": {"threads": a.threads}}
    if kind == "allreduce":
        opt = distopt.DistributedOptimizer(model, dict(job, algorithm="allreduce", optimizer={
            "name": "sgd", "lr": a.lr, "momentum": a.momentum}))
    else:
        opt = distopt.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                              lr=a.lr, momentum=a.momentum, job=job)
    train_time, acc, steps = cd.train_ddp(a, model, model, opt, a.seed, f"distopt python {kind}")
    if dist.get_rank() == 0:
        print(json.dumps({"samples_per_s": steps * a.epochs * a.batch * a.world / train_time,
                          "final_test_accuracy": acc, "train_time_s": train_time}), flush=True)
    dist.destroy_process_group()


def run_python(a, kind):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cd.free_port()),
               WORLD_SIZE=str(a.world), OMP_NUM_THREADS=str(a.threads),
               DISTOPT_RENDEZVOUS=f"tcp://127.0.0.1:{cd.free_port()}", DISTOPT_JOB_TOKEN="bench",
               DISTOPT_WORLD_SIZE=str(a.world), DISTOPT_LOCAL_WORLD_SIZE=str(a.world))
    argv = [sys.executable, os.path.abspath(__file__), "--worker", kind] + cd.worker_args(a) + [
        "--python-path", a.python_path] + sum((["--plugin-path", p] for p in a.plugin_path), [])
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r), DISTOPT_RANK=str(r),
                                             DISTOPT_LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(a.world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"distopt python {kind} failed: exit codes {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def main():
    ap = cd.comparison_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python-path", default=os.path.join(cd.ROOT, os.environ.get("DISTOPT_BUILD_DIR", "build"),
                                                          "python"))
    ap.add_argument("--worker", default="", help=argparse_suppress())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse_suppress())
    a = cd.parse_comparison_args(ap)
    if a.ddp_worker:
        return cd.ddp_worker(a)
    if a.worker:
        return python_worker(a, a.worker)
    cd.check_distopt(a)
    print(f"{a.world} ranks x {a.threads} thread(s), mlp, batch {a.batch}/rank, {a.epochs} epoch(s), "
          f"sgd lr {a.lr} momentum {a.momentum}; BLAS {cd.blas_name()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        a.config = os.path.join(tmp, "job.yaml")
        with open(a.config, "w") as f:
            f.write(f"world: {{size: {a.world}}}\ncommunicator: tcp\nreducer: mean\nalgorithm: allreduce\n"
                    f"optimizer: {{name: sgd, lr: {a.lr}, momentum: {a.momentum}}}\n"
                    f"train: {{model: mlp, epochs: {a.epochs}, batch_size: {a.batch}, seed: {a.seed}, "
                    f"log_every: 0}}\n")
        columns = [("PyTorch DDP (gloo)", lambda: cd.run_ddp(a, "gloo")),
                   ("PyTorch DDP (distopt backend)", lambda: cd.run_ddp(a, "distopt")),
                   ("distopt.DistributedOptimizer", lambda: run_python(a, "allreduce")),
                   ("distopt.ZeroRedundancyOptimizer", lambda: run_python(a, "zero")),
                   ("distopt train", lambda: cd.run_distopt(a))]
        results = {name: [] for name, _ in columns}
        for rep in range(a.repeat):
            order = columns[rep % len(columns):] + columns[:rep % len(columns)]  # rotate the first
            for name, run in order:
                r = run()
                results[name].append(r)
                print(f"  repeat {rep + 1}: {name}: {r['samples_per_s']:.0f} samples/s", file=sys.stderr)
    base = statistics.median(r["samples_per_s"] for r in results["PyTorch DDP (gloo)"])
    print(f"\n{'':32s} {'samples/s':>10s} {'(min-max)':>15s} {'vs DDP':>7s} {'test acc':>9s}")
    for name, rs in results.items():
        sps = [r["samples_per_s"] for r in rs]
        print(f"{name:32s} {statistics.median(sps):10.0f} {min(sps):7.0f}-{max(sps):<7.0f} "
              f"{statistics.median(sps) / base:6.2f}x {100 * rs[-1]['final_test_accuracy']:8.2f}%")


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
