#!/usr/bin/python3
"""Two "machines" in two network namespaces (tools/netns/hosts.py), 2 ranks
each, started the ways a user starts a multi-node job:

  * one `distopt launch --nnodes 2 --node-rank R --nproc-per-node 2
    --master-addr <host 0's address> --master-port P` per namespace;
  * a Slurm-like step: four `distopt train` tasks, two per namespace, with
    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NODEID /
    SLURM_TASKS_PER_NODE and SLURM_JOB_NODELIST naming the two addresses
    (the master is its first host), MASTER_PORT;
  * a Slurm-like step of one `distopt launch -n 2` per namespace.

Each trains the quickstart MLP to bitwise the losses and accuracy of the
same job with 4 ranks started at once on loopback (tcp with `shm: false`:
the same ring sums in the same order whatever carries the bytes).

Needs root and `ip netns`; exits 77 (ctest SKIP_RETURN_CODE) with the reason
otherwise, or without the Fashion-MNIST data set.
"""
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time

SOURCE = os.environ.get("DISTOPT_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(SOURCE, "tools", "netns"))
import hosts  # noqa: E402

CLI = os.environ.get("DISTOPT_CLI", os.path.join(SOURCE, "build/bin/distopt"))
PLUGINS = os.environ.get("DISTOPT_PLUGIN_DIR", os.path.join(SOURCE, "build/plugins"))
DATA = "/usr/share/datasets/fashion-mnist"


def job(tmp):
    path = os.path.join(tmp, "job.yaml")
    with open(path, "w") as f:
        f.write(f"plugins: {{paths: ['{PLUGINS}']}}\n"
                "world: {size: 4, timeout_s: 30}\n"
                "communicator: {name: tcp, options: {timeout_s: 15, shm: false}}\n"
                "reducer: {name: mean}\nalgorithm: {name: allreduce}\n"
                "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
                f"train: {{model: mlp, dataset: fashion-mnist, data_dir: {DATA}, epochs: 1, "
                "max_steps: 30, batch_size: 64, seed: 0, threads: 1, log_every: 10}\n")
    return path


def summary(metrics):
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    return [e for e in lines if e.get("event") == "summary"][-1]


def run_in_hosts(tmp, name, cmds):
    """cmds: [(host, argv, env)]; all started at once, each must exit 0."""
    with hosts.Hosts(2) as h:
        procs, outs = [], []
        for i, (host, argv, env) in enumerate(cmds):
            env = {k: (v(h) if callable(v) else v) for k, v in env.items()}
            argv = [a(h) if callable(a) else a for a in argv]
            outs.append(os.path.join(tmp, f"{name}{i}.out"))
            with open(outs[-1], "w") as f:
                procs.append(subprocess.Popen(h.argv(host, argv, env), stdout=f,
                                              stderr=subprocess.STDOUT))
        codes, _ = hosts.wait_all(procs, 240)
        texts = [open(o).read() for o in outs]
    assert codes == [0] * len(cmds), f"exit codes {codes}:\n" + "\n----\n".join(texts)
    return texts


def check_same(ref, got, what):
    print(f"  {what}: test accuracy {100 * got['final_test_accuracy']:.2f}% (loopback "
          f"{100 * ref['final_test_accuracy']:.2f}%), train loss {got['final_train_loss']!r}")
    assert got["world_size"] == 4, got
    for k in ("final_train_loss", "final_test_loss", "final_test_accuracy", "samples"):
        assert got[k] == ref[k], f"{what}: {k} {got[k]!r} != loopback {ref[k]!r}"
    assert got["final_test_accuracy"] > 0.5


def main():
    why = hosts.skip_reason()
    if not why and not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        why = f"the Fashion-MNIST data set is not installed ({DATA})"
    if why:
        print(f"skipped: {why}")
        return 77
    failed = 0
    with tempfile.TemporaryDirectory(prefix="distopt_netns_launch_") as tmp:
        jobf = job(tmp)
        m = os.path.join(tmp, "loopback.jsonl")
        r = subprocess.run([CLI, "train", jobf, "--metrics", m], capture_output=True, text=True,
                           timeout=240)
        if r.returncode != 0:
            print(f"loopback reference failed:\n{r.stdout}{r.stderr}")
            return 1
        ref = summary(m)
        port = 20000 + secrets.randbelow(40000)  # fresh namespaces: any port is free
        cases = {
            "launch --nnodes 2 --node-rank R": [
                (n, [CLI, "launch", "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node",
                     "2", "--master-addr", (lambda h: h.addr[0]), "--master-port", str(port),
                     "--", CLI, "train", jobf, "--metrics", os.path.join(tmp, "nodes.jsonl")],
                 {}) for n in range(2)],
            "srun-like distopt train (4 tasks)": [
                (r // 2, [CLI, "train", jobf, "--metrics", os.path.join(tmp, "srun.jsonl")],
                 {"SLURM_PROCID": r, "SLURM_NTASKS": 4, "SLURM_LOCALID": r % 2,
                  "SLURM_NODEID": r // 2, "SLURM_TASKS_PER_NODE": "2(x2)",
                  "SLURM_JOB_NODELIST": (lambda h: ",".join(h.addr)), "SLURM_JOB_ID": 77,
                  "SLURM_STEP_ID": 0, "SLURM_STEP_NUM_TASKS": 4, "MASTER_PORT": port}) for r in range(4)],
            "srun-like, one distopt launch -n 2 per node": [
                (n, [CLI, "launch", "-n", "2", "--", CLI, "train", jobf, "--metrics",
                     os.path.join(tmp, "srun_launch.jsonl")],
                 {"SLURM_PROCID": n, "SLURM_NTASKS": 2, "SLURM_NNODES": 2, "SLURM_NODEID": n,
                  "SLURM_JOB_NODELIST": (lambda h: ",".join(h.addr)), "SLURM_JOB_ID": 78,
                  "SLURM_STEP_ID": 0, "SLURM_STEP_NUM_TASKS": 2, "MASTER_PORT": port}) for n in range(2)],
        }
        files = {"launch --nnodes 2 --node-rank R": "nodes.jsonl",
                 "srun-like distopt train (4 tasks)": "srun.jsonl",
                 "srun-like, one distopt launch -n 2 per node": "srun_launch.jsonl"}
        for i, (name, cmds) in enumerate(cases.items()):
            print(f"{name}:", flush=True)
            t0 = time.time()
            try:
                run_in_hosts(tmp, f"case{i}_", cmds)
                check_same(ref, summary(os.path.join(tmp, files[name])), name)
                print(f"  ok ({time.time() - t0:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 -- report every case
                failed += 1
                print(f"  FAILED ({time.time() - t0:.1f} s): {type(e).__name__}: {e}", flush=True)
    print(f"{failed} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
