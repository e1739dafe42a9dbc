#!/usr/bin/python3
"""Elastic training across "machines" whose network fails: 4 network
namespaces (tools/netns/hosts.py), one `distopt launch --elastic --nnodes 4
--node-rank R -n 1 -- distopt train` per namespace (allreduce, tcp with
`shm: false`), and mid-training the link of host 3 is cut (its bridge-side
veth goes down: no RST, no FIN, packets are lost).

Expected, all within a bounded time (every process is waited for with a
limit and killed by Hosts.close() otherwise):
  * hosts 0-2 (they still reach each other and the store, which node 0's
    launcher serves) recover without host 3 and finish the job on 3 ranks:
    their launchers exit 0, rank 0's summary has world_size 3 and every
    step, and a recovery event lost rank 3. Host 3's launcher cannot record
    its rank's death (the store is out of reach), so the survivors'
    agreement closes at world.timeout_s, and their log says so;
  * host 3's rank ends with an error naming its silent peers or the store it
    cannot reach, and its launcher exits non-zero.

Needs root and `ip netns`; exits 77 (ctest SKIP_RETURN_CODE) with the reason
otherwise, or without the Fashion-MNIST data set.
"""
import json
import os
import re
import secrets
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
NODES = 4
CUT = 3                # the host whose link is cut
COMM_TIMEOUT_S = 4     # the tcp communicator's: a silent peer fails a collective
WORLD_TIMEOUT_S = 10   # the store's and the agreement's
MAX_STEPS = 200        # of 1250 in the epoch; ~10 steps/s on 4 ranks with commit_every 1
# After the cut: the collective's timeout, the agreement's world.timeout_s,
# host 3's store request (world.timeout_s + 5 s) and its launcher's attempt
# to reach the store (10 s), the survivors' remaining steps; generous for a
# loaded machine.
LIMIT_S = 240


def job(tmp):
    path = os.path.join(tmp, "job.yaml")
    with open(path, "w") as f:
        f.write(f"plugins: {{paths: ['{PLUGINS}']}}\n"
                f"world: {{size: {NODES}, timeout_s: {WORLD_TIMEOUT_S}}}\n"
                f"communicator: {{name: tcp, options: {{timeout_s: {COMM_TIMEOUT_S}, "
                "shm: false}}\n"
                "reducer: {name: mean}\nalgorithm: {name: allreduce}\n"
                "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                "elastic: {enabled: true, min_ranks: 2, commit_every: 1}\n"
                f"train: {{model: mlp, dataset: fashion-mnist, data_dir: {DATA}, epochs: 1, "
                f"max_steps: {MAX_STEPS}, batch_size: 16, global_batch_size: 48, seed: 0, "
                "threads: 1, log_every: 10}\n")
    return path


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def events(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


def main():
    why = hosts.skip_reason()
    if not why and not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        why = f"the Fashion-MNIST data set is not installed ({DATA})"
    if why:
        print(f"skipped: {why}")
        return 77
    with tempfile.TemporaryDirectory(prefix="distopt_netns_elastic_cut_") as tmp:
        jobf = job(tmp)
        port = 20000 + secrets.randbelow(40000)  # fresh namespaces: any port is free
        token = "elastic-cut-" + secrets.token_hex(6)
        metrics = [os.path.join(tmp, f"node{n}.jsonl") for n in range(NODES)]
        outs = [os.path.join(tmp, f"node{n}.out") for n in range(NODES)]
        with hosts.Hosts(NODES) as h:
            procs = []
            for n in range(NODES):
                argv = [CLI, "launch", "--elastic", "--nnodes", str(NODES), "--node-rank", str(n),
                        "-n", "1", "--master-addr", h.addr[0], "--master-port", str(port),
                        "--rdzv-id", token, "--", CLI, "train", jobf, "--metrics", metrics[n]]
                with open(outs[n], "w") as f:
                    procs.append(hosts.subprocess.Popen(h.argv(n, argv), stdout=f,
                                                        stderr=hosts.subprocess.STDOUT))
            t0 = time.time()
            while time.time() - t0 < 180:
                steps = [int(s) for s in re.findall(r"step (\d+)/", read(outs[0]))]
                if (steps and steps[-1] >= 20) or any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.05)
            if any(p.poll() is not None for p in procs) or not steps or steps[-1] >= MAX_STEPS:
                texts = "\n----\n".join(read(o) for o in outs)
                print(f"FAILED: a launcher ended, or no progress, before the cut:\n{texts}")
                return 1
            print(f"cutting host {CUT}'s link at step {steps[-1]} "
                  f"({time.time() - t0:.1f} s after the start)", flush=True)
            h.link_down(CUT)
            codes, secs = hosts.wait_all(procs, LIMIT_S)
            texts = [read(o) for o in outs]
        print(f"after the cut: exit codes {codes}, seconds {[round(s or -1, 1) for s in secs]}")
        failed = []

        def check(ok, what):
            print(("  ok: " if ok else "  FAILED: ") + what, flush=True)
            if not ok:
                failed.append(what)

        for n in range(NODES):
            check(codes[n] is not None, f"host {n}'s launcher ended within {LIMIT_S} s")
        for n in range(NODES):
            if n != CUT:
                check(codes[n] == 0, f"host {n}'s launcher exited 0 (got {codes[n]})")
        check(codes[CUT] not in (None, 0), f"host {CUT}'s launcher exited non-zero "
              f"(got {codes[CUT]})")
        summary = [e for e in events(metrics[0]) if e.get("event") == "summary"]
        recoveries = [e for e in events(metrics[0]) if e.get("event") == "recovery"]
        check(bool(summary) and summary[-1].get("world_size") == NODES - 1,
              f"rank 0's summary: world_size {NODES - 1} "
              f"({summary[-1] if summary else 'no summary'})")
        check(any(e.get("lost") == [CUT] and e.get("world_size") == NODES - 1 for e in recoveries),
              f"a recovery lost rank {CUT} and went on with {NODES - 1} ({recoveries})")
        check(bool(re.search(rf"step {MAX_STEPS}/", texts[0])),
              f"rank 0 trained to step {MAX_STEPS}")
        # The agreement could not learn of host 3's death from its launcher.
        check("world.timeout_s passed" in "".join(texts[:CUT]),
              "the survivors' membership closed at world.timeout_s (host 3 unrecorded)")
        # Host 3's rank: an error naming what it lost.
        err = [l for l in texts[CUT].splitlines() if "error" in l.lower() or "failed" in l]
        print("  host 3's last error lines:\n    " + "\n    ".join(err[-4:]))
        check(bool(re.search(r"ranks 0, 1, 2 silent for [0-9.]+ s", texts[CUT])),
              "host 3's collective failed naming its silent peers")
        # Its last error names the store and the request that timed out (not
        # only "connection is closed").
        check(bool(re.search(r"error: rendezvous store at [0-9.]+:\d+: .*timed out", texts[CUT])),
              "host 3's rank ends with an error naming the store and the timeout")
        check(bool(re.search(rf"cannot record member {CUT}'s failure in the store", texts[CUT])),
              "host 3's launcher says it could not record the death in the store")
        if failed:
            for n in range(NODES):
                print(f"---- host {n} ----\n{texts[n]}")
            return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
