#!/usr/bin/python3
"""Compare distopt's `zero` algorithm with PyTorch's ZeroRedundancyOptimizer, in one run.

The same job on both sides: mlp 784-512-256-10 (ReLU) on the Fashion-MNIST
IDX files, 2 ranks on 127.0.0.1, the same per-rank and global batch, epochs
(or steps per epoch), Adam (lr 1e-3), seed, intra-op threads per rank and
OPENBLAS_CORETYPE (compare_ddp.py's choice, inherited by every rank of both
sides). Rows:

  1. PyTorch DDP (gloo, Debian python3-torch) + ZeroRedundancyOptimizer(Adam)
     with its defaults (parameters_as_bucket_view=False: one broadcast per
     parameter from its owner after the step);
  2. `distopt train` with algorithm zero {stage: 1, partition: greedy}: the
     same sorted-greedy partition over whole parameters and the same
     broadcast per parameter;
  3. `distopt train` with zero {stage: 2, partition: contiguous,
     parameters_as_bucket_view: true}: gradients reduce-scattered, state cut
     into equal halves, parameters allgathered (--no-stage2 skips it).

Both sides time only the training steps (not the per-epoch evaluation of the
full 10k test set). Every row runs --repeat times, interleaved (PyTorch,
stage 1, stage 2, PyTorch, ...) so load drift hits every row alike; the
table gives the median samples/s with its range, the ratio of medians to
PyTorch with the range of per-repetition ratios (each run against that
repetition's PyTorch run), the last run's test accuracy (every run of a row
trains identically) and the optimizer state bytes per rank:
PyTorch = the sum of the local optimizer's state tensors on each rank
(torch 1.13 Adam keeps 'step' as a 4-byte tensor per parameter; listed
apart), distopt = the summary's state_bytes_per_rank (exp_avg + exp_avg_sq;
libtorch's step count is an int field, not a tensor).

    tools/bench/compare_zero.py [--distopt build/bin/distopt] [--plugin-path build/plugins]
        [--epochs 2] [--max-steps 0] [--batch 256] [--threads N] [--repeat 3] [--no-stage2]

Needs Debian's python3-torch (run with /usr/bin/python3). Reuses
tools/bench/compare_ddp.py's data loading, BLAS selection and distopt runner.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_ddp as cd  # noqa: E402

ROOT = cd.ROOT
LR, SEED = 1e-3, 0


def zero_worker(a):
    """One rank of DDP + ZeroRedundancyOptimizer(Adam) (RANK/WORLD_SIZE/MASTER_* set)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(SEED)
    model = cd.mlp()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    train_time, acc, steps = cd.train_ddp(a, model, ddp, opt, SEED, "ddp+zero", a.max_steps)
    global_batch = a.batch * world

    # This rank's local optimizer state: every tensor, and the 'step' ones apart.
    total, step_bytes = 0, 0
    for st in opt.optim.state.values():
        for k, v in st.items():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
                step_bytes += v.numel() * v.element_size() if k == "step" else 0
    mine = torch.zeros(2 * world, dtype=torch.float64)
    mine[2 * rank], mine[2 * rank + 1] = float(total), float(step_bytes)
    dist.all_reduce(mine)
    if rank == 0:
        print(json.dumps({"samples_per_s": steps * a.epochs * global_batch / train_time,
                          "final_test_accuracy": acc, "train_time_s": train_time, "steps": steps * a.epochs,
                          "state_bytes_per_rank": [int(mine[2 * r]) for r in range(world)],
                          "step_bytes_per_rank": [int(mine[2 * r + 1]) for r in range(world)]}), flush=True)
    dist.destroy_process_group()


def run_pytorch(a):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cd.free_port()), WORLD_SIZE=str(a.world),
               OMP_NUM_THREADS=str(a.threads))
    argv = [sys.executable, os.path.abspath(__file__), "--zero-worker", "--data", a.data, "--threads",
            str(a.threads), "--epochs", str(a.epochs), "--max-steps", str(a.max_steps), "--batch", str(a.batch)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(a.world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"PyTorch ZeroRedundancyOptimizer run failed: exit codes {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def run_distopt(a, zero_options, tmp, name):
    """`distopt train` with algorithm zero on a job file written here; its summary metrics."""
    cfg = os.path.join(tmp, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(f"world: {{size: {a.world}, timeout_s: 60}}\n"
                "communicator: {name: tcp}\n"
                "reducer: {name: mean}\n"
                f"algorithm: {{name: zero, options: {zero_options}}}\n"
                f"optimizer: {{name: adam, lr: {LR}}}\n"
                f"train: {{model: mlp, epochs: {a.epochs}, batch_size: {a.batch}, seed: {SEED}, "
                f"threads: {a.threads}, log_every: 0}}\n")
    ra = argparse.Namespace(config=cfg, distopt=a.distopt, plugin_path=a.plugin_path, threads=a.threads,
                            epochs=a.epochs, data=a.data, max_steps=a.max_steps)
    return cd.run_distopt(ra)


def fmt_bytes(v):
    return " / ".join(str(b) for b in v)


def main():
    ap = cd.comparison_parser(__doc__)
    ap.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0: the whole epoch)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row, interleaved")
    ap.add_argument("--no-stage2", action="store_true", help="skip the stage 2 row")
    ap.add_argument("--zero-worker", action="store_true", help=argparse.SUPPRESS)
    a = cd.parse_comparison_args(ap)
    if a.zero_worker:
        return zero_worker(a)
    cd.check_distopt(a)

    print(f"mlp, {a.world} ranks x {a.threads} thread(s) on {os.cpu_count()} cores, batch {a.batch}/rank "
          f"(global {a.batch * a.world}), {a.epochs} epoch(s){f' x {a.max_steps} steps' if a.max_steps else ''}, "
          f"adam lr {LR}, {a.repeat} run(s) per row; BLAS {cd.blas_name()}", flush=True)
    rows = [("PyTorch ZeRO (DDP+ZeroRedundancyOptimizer)", lambda tmp: run_pytorch(a)),
            ("distopt zero stage 1 greedy", lambda tmp: run_distopt(a, "{stage: 1, partition: greedy}", tmp, "s1"))]
    if not a.no_stage2:
        rows.append(("distopt zero stage 2 contiguous", lambda tmp: run_distopt(
            a, "{stage: 2, partition: contiguous, parameters_as_bucket_view: true}", tmp, "s2")))
    results = [[] for _ in rows]
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeat):
            for i, (name, fn) in enumerate(rows):
                load = os.getloadavg()[0]
                loads.append(load)
                r = fn(tmp)
                results[i].append(r)
                print(f"run {rep + 1}/{a.repeat} {name}: {r['samples_per_s']:.0f} samples/s, test accuracy "
                      f"{100 * r['final_test_accuracy']:.2f}% (1-min load average before: {load:.2f})", flush=True)

    base = statistics.median(r["samples_per_s"] for r in results[0])
    print(f"\n{'':43s} {'samples/s':>9s} {'(min-max)':>15s} {'ratio':>6s} {'(paired)':>13s} {'test acc':>8s}  "
          "optimizer state bytes per rank (rank 0 / rank 1 ...)")
    for (name, _), rs in zip(rows, results):
        sps = [r["samples_per_s"] for r in rs]
        med = statistics.median(sps)
        # Each run against the PyTorch run of its repetition (same load, seconds apart).
        paired = [r["samples_per_s"] / p["samples_per_s"] for r, p in zip(rs, results[0])]
        last = rs[-1]
        state = fmt_bytes(last["state_bytes_per_rank"])
        if "step_bytes_per_rank" in last:
            state += " (of which 'step' tensors: " + fmt_bytes(last["step_bytes_per_rank"]) + ")"
        print(f"{name:43s} {med:9.0f} {f'({min(sps):.0f}-{max(sps):.0f})':>15s} {med / base:5.2f}x "
              f"{f'({min(paired):.2f}-{max(paired):.2f})':>13s} {100 * last['final_test_accuracy']:7.2f}%  {state}")
    print(f"\nratio = median samples/s / PyTorch's median; paired = per repetition, against that repetition's "
          f"PyTorch run.\n1-min load average before the runs: {min(loads):.2f}-{max(loads):.2f} on "
          f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
