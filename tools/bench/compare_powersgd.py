#!/usr/bin/python3
"""Compare distopt's `powersgd` reducer with PyTorch's powerSGD_hook, in one run.

Three trainings of the same job (mlp 784-512-256-10 on the Fashion-MNIST IDX
files, 2 ranks on 127.0.0.1, same per-rank and global batch, epochs, SGD lr
0.1 momentum 0.9, intra-op threads per rank and OPENBLAS_CORETYPE):

  1. PyTorch DDP (gloo, Debian python3-torch) with
     torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook
     (matrix_approximation_rank=R, start_powerSGD_iter=S, error feedback and
     warm start on: the hook's defaults);
  2. `distopt train` with reducer powersgd {rank: R, start_iter: S};
  3. `distopt train` with reducer mean (the uncompressed reference accuracy).

Bytes are what one rank sends in a ring allreduce (2 (W-1)/W x the buffer)
of every buffer the reduction allreduces, per step once compression runs;
"plain" is the same for an uncompressed allreduce of all gradients. For DDP
they are counted by wrapping torch.distributed.all_reduce inside the ranks.

    tools/bench/compare_powersgd.py [--distopt build/bin/distopt]
        [--plugin-path build/plugins] [--rank 4] [--start-iter 10]
        [--epochs 2] [--batch 256] [--threads N] [--no-mean]

Needs Debian's python3-torch (run with /usr/bin/python3). Reuses
tools/bench/compare_ddp.py's data loading, BLAS selection and distopt runner.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_ddp as cd  # noqa: E402

ROOT = cd.ROOT
LR, MOMENTUM, SEED = 0.1, 0.9, 0


def ddp_worker(a):
    """One DDP rank with the powerSGD hook (RANK/WORLD_SIZE/MASTER_* set)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)

    # Count what the hook allreduces (vanilla steps and P / Q / uncompressed
    # buffers alike): the hook modules call torch.distributed.all_reduce.
    counted = {"bytes": 0}
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        counted["bytes"] += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *args, **kwargs)

    torch.manual_seed(SEED)
    model = cd.mlp()
    ddp = DDP(model)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank,
                               start_powerSGD_iter=a.start_iter)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)

    step_bytes, before = [], [0]

    def epoch_begin():
        dist.all_reduce = counting_all_reduce

    def epoch_end():
        dist.all_reduce = real_all_reduce

    def step_begin():
        before[0] = counted["bytes"]

    def step_end():
        step_bytes.append(counted["bytes"] - before[0])

    train_time, acc, steps = cd.train_ddp(a, model, ddp, opt, SEED, "ddp+powerSGD_hook", 0, epoch_begin,
                                          epoch_end, step_begin, step_end)
    global_batch = a.batch * world
    if rank == 0:
        ring = 2 * (world - 1) / world
        compressed = step_bytes[a.start_iter:]
        print(json.dumps({"samples_per_s": steps * a.epochs * global_batch / train_time,
                          "final_test_accuracy": acc, "train_time_s": train_time,
                          "plain_bytes_per_step": ring * step_bytes[0],
                          "bytes_per_step": ring * sum(compressed) / max(1, len(compressed)),
                          "bytes_total": ring * sum(step_bytes)}), flush=True)
    dist.destroy_process_group()


def run_ddp(a):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cd.free_port()), WORLD_SIZE=str(a.world),
               OMP_NUM_THREADS=str(a.threads))
    argv = [sys.executable, os.path.abspath(__file__), "--ddp-worker", "--data", a.data, "--threads",
            str(a.threads), "--epochs", str(a.epochs), "--batch", str(a.batch), "--rank", str(a.rank),
            "--start-iter", str(a.start_iter)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(a.world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"DDP run failed: exit codes {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def run_distopt(a, reducer_yaml, tmp, name):
    """`distopt train` on a job file written here; returns its summary metrics
    plus per-step bytes (plain, and once compression runs)."""
    cfg = os.path.join(tmp, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(f"world: {{size: {a.world}, timeout_s: 60}}\n"
                "communicator: {name: tcp}\n"
                f"reducer: {reducer_yaml}\n"
                "algorithm: {name: allreduce}\n"
                f"optimizer: {{name: sgd, lr: {LR}, momentum: {MOMENTUM}}}\n"
                f"train: {{model: mlp, epochs: {a.epochs}, batch_size: {a.batch}, seed: {SEED}, "
                f"threads: {a.threads}}}\n")
    ra = argparse.Namespace(config=cfg, distopt=a.distopt, plugin_path=a.plugin_path, threads=a.threads,
                            epochs=a.epochs, data=a.data, max_steps=0)
    s = cd.run_distopt(ra)
    steps = s["steps"]
    plain = s["bytes_sent_plain_allreduce_per_rank"][0] / steps
    sent = s["bytes_sent_per_rank"][0]
    warm = a.start_iter if name == "powersgd" else 0
    s["plain_bytes_per_step"] = plain
    s["bytes_per_step"] = (sent - warm * plain) / (steps - warm)
    s["bytes_total"] = sent
    return s


def main():
    ap = cd.comparison_parser(__doc__)
    ap.add_argument("--rank", type=int, default=4, help="PowerSGD approximation rank")
    ap.add_argument("--start-iter", type=int, default=10, help="plain allreduce steps before compression")
    ap.add_argument("--no-mean", action="store_true", help="skip the uncompressed `mean` reference run")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    a = cd.parse_comparison_args(ap)
    if a.ddp_worker:
        return ddp_worker(a)
    cd.check_distopt(a)

    print(f"mlp, {a.world} ranks x {a.threads} thread(s), batch {a.batch}/rank (global {a.batch * a.world}), "
          f"{a.epochs} epoch(s), sgd lr {LR} momentum {MOMENTUM}; PowerSGD rank {a.rank}, start iteration "
          f"{a.start_iter}; BLAS {cd.blas_name()}", flush=True)
    rows = [("PyTorch DDP + powerSGD_hook", run_ddp(a))]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("distopt powersgd", run_distopt(
            a, f"{{name: powersgd, options: {{rank: {a.rank}, start_iter: {a.start_iter}}}}}", tmp, "powersgd")))
        if not a.no_mean:
            rows.append(("distopt mean (uncompressed)", run_distopt(a, "{name: mean}", tmp, "mean")))

    print(f"\n{'':30s} {'samples/s':>10s} {'test acc':>9s} {'bytes/step':>11s} {'plain/step':>11s} "
          f"{'compression':>11s} {'total sent':>11s}")
    for name, r in rows:
        print(f"{name:30s} {r['samples_per_s']:10.0f} {100 * r['final_test_accuracy']:8.2f}% "
              f"{r['bytes_per_step']:11.0f} {r['plain_bytes_per_step']:11.0f} "
              f"{r['plain_bytes_per_step'] / r['bytes_per_step']:10.1f}x {r['bytes_total'] / 1e6:9.2f}MB")
    ddp, ours = rows[0][1], rows[1][1]
    print(f"{'ratio distopt / PyTorch':30s} {ours['samples_per_s'] / ddp['samples_per_s']:9.2f}x "
          f"{100 * (ours['final_test_accuracy'] - ddp['final_test_accuracy']):+8.2f}pp "
          f"{ours['bytes_per_step'] / ddp['bytes_per_step']:10.2f}x")
    if len(rows) > 2:
        print(f"{'powersgd vs mean accuracy':30s} {'':10s} "
              f"{100 * (ours['final_test_accuracy'] - rows[2][1]['final_test_accuracy']):+8.2f}pp")


if __name__ == "__main__":
    main()
