#!/usr/bin/python3
"""Multi-host on one machine: 3 network namespaces joined by veth pairs
through a bridge (tools/netns/hosts.py), one `distopt train` rank per
namespace with the tcp communicator (and with ucx over UCX_TLS=tcp),
rendezvous on the first host's address.

  * the quickstart MLP (allreduce + SGD, fewer steps) trains to the same
    result as the same job on loopback: bitwise the same losses as loopback
    with `shm: false` (the same ring over another network), test accuracy
    within 0.5 points of loopback with shared memory, and above a floor;
  * shared memory is off between namespaces, also for ranks that share a
    mount namespace (nsenter --net; regression: tcp used /dev/shm there);
  * a link cut mid-training (`ip link set ... down`: no RST, no FIN) makes
    every rank exit non-zero within timeout_s + world.timeout_s, naming the
    silent peer, and nothing hangs.

  * a stranger in a fourth namespace, without the job's token, is refused
    by the store (wrong, empty or no token: it reads and writes nothing),
    by the tcp communicator's listener (a hello with a wrong token, junk),
    and reaches nothing through ucx (junk on UCX's TCP ports, and a forged
    UCP endpoint sending failure notices and random tags: UCX accepts the
    connection, but the tags are keyed by the token); the jobs finish with
    bitwise the losses of the same jobs on loopback, no rank crashes.

Needs root and `ip netns`; exits 77 (ctest SKIP_RETURN_CODE) with the reason
otherwise, or without the Fashion-MNIST data set.
"""
import json
import os
import re
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
STRANGER = os.path.join(SOURCE, "tests", "netns", "stranger.py")
UCX_STRANGER = os.environ.get("DISTOPT_UCX_STRANGER",
                              os.path.join(SOURCE, "build/bin/ucx_stranger"))
PLUGINS = os.environ.get("DISTOPT_PLUGIN_DIR", os.path.join(SOURCE, "build/plugins"))
DATA = "/usr/share/datasets/fashion-mnist"
WORLD = 3
COMM_TIMEOUT_S = 8
WORLD_TIMEOUT_S = 20


def job(tmp, name, shm="true", epochs=1, max_steps=60, comm=None):
    """The quickstart job (share/distopt/examples/allreduce-sgd.yaml) with
    fewer steps, one thread per rank and shorter timeouts; `comm`: another
    communicator section than tcp's."""
    path = os.path.join(tmp, name)
    comm = comm or f"{{name: tcp, options: {{timeout_s: {COMM_TIMEOUT_S}, shm: {shm}}}}}"
    with open(path, "w") as f:
        f.write(f"plugins: {{paths: ['{PLUGINS}']}}\n"
                f"world: {{size: {WORLD}, timeout_s: {WORLD_TIMEOUT_S}}}\n"
                f"communicator: {comm}\n"
                "reducer: {name: mean, options: {bucket_cap_mb: 25, align_bytes: 8}}\n"
                "algorithm: {name: allreduce}\n"
                "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
                f"train: {{model: mlp, dataset: fashion-mnist, data_dir: {DATA}, epochs: {epochs}, "
                f"max_steps: {max_steps}, batch_size: 256, seed: 0, threads: 1, log_every: 10}}\n")
    return path


def summary(metrics):
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    return [e for e in lines if e.get("event") == "summary"][-1]


def read(path):
    with open(path) as f:
        return f.read()


def test_training_matches_loopback(tmp):
    ref = {}
    for shm in ("true", "false"):
        m = os.path.join(tmp, f"loopback_{shm}.jsonl")
        r = subprocess.run([CLI, "train", job(tmp, f"lo_{shm}.yaml", shm), "--metrics", m],
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"loopback shm={shm} failed:\n{r.stdout}{r.stderr}"
        ref[shm] = summary(m)
    with hosts.Hosts(WORLD) as h:
        m = os.path.join(tmp, "netns.jsonl")
        procs, outs = h.launch([CLI, "train", job(tmp, "ns.yaml"), "--metrics", m], tmp)
        codes, _ = hosts.wait_all(procs, 180)
        assert codes == [0] * WORLD, f"exit codes {codes}:\n" + read(outs[0])
        rank0 = read(outs[0])
    assert "collectives over TCP: another host than rank 0's" in rank0, rank0
    ns = summary(m)
    acc, lo_tcp, lo_shm = (ns["final_test_accuracy"], ref["false"], ref["true"])
    print(f"  test accuracy: netns {100 * acc:.2f}%, loopback tcp "
          f"{100 * lo_tcp['final_test_accuracy']:.2f}%, loopback shm "
          f"{100 * lo_shm['final_test_accuracy']:.2f}%; train loss netns "
          f"{ns['final_train_loss']!r}, loopback tcp {lo_tcp['final_train_loss']!r}")
    # The same ring reduces in the same order whatever carries the bytes.
    assert ns["final_train_loss"] == lo_tcp["final_train_loss"]
    assert ns["final_test_loss"] == lo_tcp["final_test_loss"]
    assert ns["bytes_sent_per_rank"] == lo_tcp["bytes_sent_per_rank"]
    # Shared memory sums in another order: close, not equal.
    assert abs(acc - lo_shm["final_test_accuracy"]) <= 0.005
    assert acc >= 0.78  # measured 82.4% (3 ranks x 60 steps of 256)


def test_ucx_training_matches_loopback(tmp):
    # ucx (UCX_TLS=tcp: UCX's TCP transport over the veth links), one rank
    # per namespace: the SDK's ring reduces in the same order on loopback
    # and across hosts, so the results are bitwise those of loopback ucx
    # (with shm: false there; on one host ucx would use shared memory).
    if not os.path.exists(os.path.join(PLUGINS, "libdistopt_ucx.so")):
        print("  ucx plugin not built (UCX not found): case skipped")
        return
    ucx = f"{{name: ucx, options: {{timeout_s: {COMM_TIMEOUT_S}}}}}"
    ucx_lo = f"{{name: ucx, options: {{timeout_s: {COMM_TIMEOUT_S}, shm: false}}}}"
    m_lo = os.path.join(tmp, "ucx_loopback.jsonl")
    r = subprocess.run(["env", "UCX_TLS=tcp", CLI, "train", job(tmp, "ucx_lo.yaml", comm=ucx_lo),
                        "--metrics", m_lo], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"loopback ucx failed:\n{r.stdout}{r.stderr}"
    with hosts.Hosts(WORLD) as h:
        m = os.path.join(tmp, "ucx_netns.jsonl")
        procs, outs = h.launch(["env", "UCX_TLS=tcp", CLI, "train", job(tmp, "ucx_ns.yaml", comm=ucx),
                                "--metrics", m], tmp)
        codes, _ = hosts.wait_all(procs, 180)
        assert codes == [0] * WORLD, f"exit codes {codes}:\n" + read(outs[0])
    ns, lo = summary(m), summary(m_lo)
    print(f"  ucx test accuracy: netns {100 * ns['final_test_accuracy']:.2f}%, loopback "
          f"{100 * lo['final_test_accuracy']:.2f}%")
    assert ns["final_train_loss"] == lo["final_train_loss"]
    assert ns["final_test_loss"] == lo["final_test_loss"]
    assert ns["final_test_accuracy"] >= 0.78  # measured: see the print above


def test_no_shared_memory_across_network_namespaces(tmp):
    # nsenter --net keeps the mount namespace (and so /dev/shm and its id):
    # only the network namespace tells these "hosts" apart.
    with hosts.Hosts(WORLD) as h:
        procs, outs = h.launch([CLI, "train", job(tmp, "nsenter.yaml", max_steps=3)], tmp,
                               enter=lambda r: ["nsenter", f"--net=/run/netns/{h.ns[r]}"])
        codes, _ = hosts.wait_all(procs, 120)
        rank0 = read(outs[0])
    assert codes == [0] * WORLD, f"exit codes {codes}:\n{rank0}"
    assert "collectives over TCP: another host than rank 0's" in rank0, rank0


def test_cut_link_fails_every_rank_naming_the_silent_peer(tmp):
    limit = COMM_TIMEOUT_S + WORLD_TIMEOUT_S + 15
    with hosts.Hosts(WORLD) as h:
        procs, outs = h.launch([CLI, "train", job(tmp, "cut.yaml", epochs=50, max_steps=0)], tmp)
        t0 = time.time()
        while time.time() - t0 < 120:
            steps = [int(s) for s in re.findall(r"step (\d+)/", read(outs[0]))]
            if steps and steps[-1] >= 40 or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.1)
        assert all(p.poll() is None for p in procs), "a rank ended before the cut"
        h.link_down(2)
        codes, secs = hosts.wait_all(procs, limit)
        texts = [read(o) for o in outs]
    print(f"  after the cut: exit codes {codes}, seconds {[round(s or -1, 1) for s in secs]}")
    for r in range(WORLD):
        assert codes[r] is not None, f"rank {r} still running {limit} s after the cut:\n{texts[r]}"
        assert codes[r] != 0, texts[r]
    errors = [[l for l in t.splitlines() if "error" in l] for t in texts]
    for r in range(WORLD):
        print(f"  rank {r}: {errors[r][-1] if errors[r] else '(no error line)'}")
    for r in (0, 1):
        assert re.search(r"rank 2 silent for [0-9.]+ s", texts[r]), texts[r]
    assert re.search(r"ranks 0, 1 silent for [0-9.]+ s", texts[2]), texts[2]
    assert "collective mismatch" not in "".join(texts)


def _ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert r.returncode == 0, f"ip {' '.join(args)}: {r.stderr}"


def wait_until(what, fn, procs, timeout_s=60):
    """fn()'s first truthy value; fails if a rank ends first or after timeout_s."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        v = fn()
        if v:
            return v
        assert all(p.poll() is None for p in procs), f"a rank ended while waiting for {what}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stranger(h, host, *args):
    """Run stranger.py in host `host` (not one of the job's); its JSON."""
    r = subprocess.run(h.argv(host, [sys.executable, STRANGER, *args]), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, f"stranger {args}: {r.stdout}{r.stderr}"
    return json.loads(r.stdout)


def loopback_reference(tmp, name, yaml, env=()):
    m = os.path.join(tmp, name + ".jsonl")
    r = subprocess.run(["env", *env, CLI, "train", yaml, "--metrics", m], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, f"loopback {name} failed:\n{r.stdout}{r.stderr}"
    return summary(m)


def assert_same_run(ns, lo, what):
    print(f"  {what}: train loss {ns['final_train_loss']!r} (loopback {lo['final_train_loss']!r}), "
          f"test accuracy {100 * ns['final_test_accuracy']:.2f}%")
    assert ns["final_train_loss"] == lo["final_train_loss"]
    assert ns["final_test_loss"] == lo["final_test_loss"]
    assert ns["final_test_accuracy"] == lo["final_test_accuracy"]


def check_store_refuses(h, stranger_host, outs):
    """(a) The store refuses a stranger with a wrong, an empty or no token:
    one reply, kRefused (frame: length 1, status 2), then it closes; the
    stranger's SET / GET behind the hello get nothing."""
    got = stranger(h, stranger_host, "store", h.addr[0], str(h.port))
    for name, r in got.items():
        # Closed, or reset when the SET / GET behind the hello stayed unread.
        assert r["reply"] == "0100000002" and r["end"] in ("closed", "reset"), f"store, {name}: {r}"
    rank0 = read(outs[0])
    who = f"refused connection from {h.addr[stranger_host]}:"
    assert len(re.findall(re.escape(who) + r"\d+: wrong job token", rank0)) == 2, rank0
    assert re.search(re.escape(who) + r"\d+: malformed first frame", rank0), rank0


def test_tcp_refuses_strangers_without_the_token(tmp):
    # Host 3 is the stranger's. Rank 2 cannot reach rank 1 (a `prohibit`
    # route) until the stranger is done, so rank 1 still listens for rank
    # 2's connections then; rank 2 retries and connects once it is lifted.
    lo = loopback_reference(tmp, "tok_lo", job(tmp, "tok_lo.yaml", "false"))
    with hosts.Hosts(WORLD + 1) as h:
        _ip("-n", h.ns[2], "route", "add", "prohibit", f"{h.addr[1]}/32")
        m = os.path.join(tmp, "tok_ns.jsonl")
        procs, outs = h.launch([CLI, "train", job(tmp, "tok_ns.yaml", "false"), "--metrics", m], tmp,
                               world=WORLD)
        ports = wait_until("rank 1's listener", lambda: [p for _, p, _ in h.listening(1)], procs)
        hello = [stranger(h, WORLD, "tcp-hello", h.addr[1], str(p)) for p in ports]
        _ip("-n", h.ns[2], "route", "del", "prohibit", f"{h.addr[1]}/32")
        check_store_refuses(h, WORLD, outs)
        codes, _ = hosts.wait_all(procs, 180)
        texts = [read(o) for o in outs]
    assert codes == [0] * WORLD, f"exit codes {codes}:\n" + "\n".join(texts)
    # Refused before anything is read past the hello: no 'K', closed.
    for r in hello:
        for name, v in r.items():  # reset: the bytes behind the hello stayed unread
            assert v["reply"] == "" and v["end"] in ("closed", "reset"), f"tcp listener, {name}: {v}"
    who = re.escape(f"refused connection from {h.addr[WORLD]}:") + r"\d+: "
    assert re.search(who + "wrong job token", texts[1]), texts[1]
    assert re.search(who + r"not a distopt tcp peer \(bad magic\)", texts[1]), texts[1]
    assert_same_run(summary(m), lo, "tcp with strangers")


def ucx_ports(h, r):
    """UCX's TCP ports that host r listens on on its network address (not
    the store's; those on 127.0.0.1 are out of a stranger's reach)."""
    return [(a, p) for a, p, _ in h.listening(r) if p != h.port and a in (h.addr[r], "0.0.0.0", "*")]


def forge_ucp_endpoint(h, host, target_ip, target_port, limit_s):
    """Start ucx_stranger in `host` against target_ip:target_port, killed
    after limit_s (`timeout`: exit 124); returns the process. Its own port
    is random; it exits 1 (and is retried by the caller) when the port's two
    bytes occur more than once in its address."""
    own = 30000 + secrets.randbelow(30000)
    env = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0", "UCX_TCP_PORT_RANGE": f"{own}-{own}",
           "UCX_WARN_UNUSED_ENV_VARS": "n"}
    argv = ["timeout", str(limit_s), UCX_STRANGER, h.addr[host], str(own), target_ip,
            str(target_port), str(WORLD)]
    return subprocess.Popen(h.argv(host, argv, env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def syn_retransmissions(h, i):
    """TcpExt TCPSynRetrans of host i (/proc/net/netstat is per namespace):
    SYNs of its own that went unanswered for a second."""
    text = subprocess.run(h.argv(i, ["cat", "/proc/net/netstat"]), capture_output=True, text=True,
                          check=True).stdout.splitlines()
    head, values = [l.split() for l in text if l.startswith("TcpExt:")][:2]
    return int(values[head.index("TCPSynRetrans")])


def forge_all(h, jobs):
    """ucx_stranger for every (host, ip, port, limit_s) in `jobs`, at once;
    their (exit code, last line)."""
    out = [None] * len(jobs)
    for _ in range(4):  # again for those whose port bytes were ambiguous
        procs = {i: forge_ucp_endpoint(h, *jobs[i]) for i, o in enumerate(out)
                 if o is None or o[0] == 1}
        for i, p in procs.items():
            text = p.communicate(timeout=jobs[i][3] + 30)[0].strip()
            out[i] = (p.returncode, text.splitlines()[-1] if text else "")
    return out


def test_ucx_strangers_without_the_token_reach_nothing(tmp):
    # ucx (UCX_TLS=tcp). From a fourth host, junk on every UCX port (UCX
    # 1.13 aborts the process on a UCT-looking stream: measured) and a
    # forged UCP endpoint never get a connection: the listeners drop
    # packets from outside the job's hosts. From a job host (they pass
    # that filter: host 1's namespace), a forged endpoint connects and
    # sends failure notices with every tag of the public layout (this made
    # every rank fail before the tags were keyed) and random tags: none
    # matches. The job's losses are bitwise loopback's.
    if not os.path.exists(os.path.join(PLUGINS, "libdistopt_ucx.so")):
        print("  ucx plugin not built (UCX not found): case skipped")
        return
    assert os.path.exists(UCX_STRANGER), f"{UCX_STRANGER} is not built"
    ucx = f"{{name: ucx, options: {{timeout_s: {COMM_TIMEOUT_S}}}}}"
    ucx_lo = f"{{name: ucx, options: {{timeout_s: {COMM_TIMEOUT_S}, shm: false}}}}"  # the ring
    steps, epochs = 300, 4
    lo = loopback_reference(tmp, "tok_ucx_lo",
                            job(tmp, "tok_ucx_lo.yaml", comm=ucx_lo, epochs=epochs, max_steps=steps),
                            ["UCX_TLS=tcp"])
    with hosts.Hosts(WORLD + 1) as h:
        m = os.path.join(tmp, "tok_ucx_ns.jsonl")
        yaml = job(tmp, "tok_ucx_ns.yaml", comm=ucx, epochs=epochs, max_steps=steps)
        procs, outs = h.launch(["env", "UCX_TLS=tcp", CLI, "train", yaml, "--metrics", m], tmp,
                               world=WORLD)
        ports = [wait_until(f"rank {r}'s UCX listener", lambda: ucx_ports(h, r), procs)
                 for r in range(WORLD)]
        targets = [(h.addr[r], p) for r in range(WORLD) for _, p in ports[r]]
        junk = [subprocess.Popen(h.argv(WORLD, [sys.executable, STRANGER, "junk", ip, str(p)]),
                                 stdout=subprocess.PIPE, text=True) for ip, p in targets]
        outside = [(WORLD, ip, p, 3) for ip, p in targets]
        inside = [(1, ip, p, 10) for ip, p in targets if ip != h.addr[1]]
        forged = forge_all(h, outside + inside)
        outside, inside = forged[:len(outside)], forged[len(outside):]
        junk = [json.loads(j.communicate(timeout=60)[0]) for j in junk]
        alive = [p.poll() is None for p in procs]
        codes, _ = hosts.wait_all(procs, 180)
        texts = [read(o) for o in outs]
        syn = [syn_retransmissions(h, i) for i in range(WORLD + 1)]
    print(f"  SYN retransmissions per host (the stranger's last): {syn}")
    print(f"  from outside the job's hosts: forged endpoints {outside}; junk {junk}")
    print(f"  from a job host: forged endpoints {inside}")
    assert codes == [0] * WORLD, f"exit codes {codes}:\n" + "\n".join(texts)
    assert all(alive), f"the job ended before the strangers were done ({alive}): more steps"
    for code, line in outside:
        assert code == 124, f"a stranger's UCP endpoint got through the filter: {code} {line}"
    for j in junk:
        for name, v in j.items():
            assert v["end"] == "error: timed out", f"junk {name} connected: {v}"
    # The listeners dropped the outside stranger's SYNs, and no SYN of the
    # job's ranks (every rank's listeners admit the job's hosts before any
    # rank connects). Host 1 is left out: its count also holds the inside
    # stranger's own SYNs (1-2 seen there, from ucx_stranger's sockets per
    # `ss`; cause not found; 0 in a run without strangers).
    assert syn[WORLD] > 0 and syn[0] == 0 and syn[2] == 0, syn
    for code, line in inside:
        assert code == 0 and "flushed (UCX accepted the connection)" in line, (code, line)
    assert "forged" not in "".join(texts), "\n".join(texts)
    assert_same_run(summary(m), lo, "ucx with strangers")


def test_ucx_source_filter_off_admits_other_hosts(tmp):
    # `source_filter: false` (peers behind NAT): a forged endpoint from
    # outside the job's hosts now connects (the filter is what kept it out
    # above), and the token-keyed tags still keep its messages out of the
    # job, which trains to the end.
    if not os.path.exists(os.path.join(PLUGINS, "libdistopt_ucx.so")):
        print("  ucx plugin not built (UCX not found): case skipped")
        return
    ucx = f"{{name: ucx, options: {{timeout_s: {COMM_TIMEOUT_S}, source_filter: false}}}}"
    with hosts.Hosts(WORLD + 1) as h:
        m = os.path.join(tmp, "nofilter_ns.jsonl")
        yaml = job(tmp, "nofilter_ns.yaml", comm=ucx, epochs=4, max_steps=300)
        procs, outs = h.launch(["env", "UCX_TLS=tcp", CLI, "train", yaml, "--metrics", m], tmp,
                               world=WORLD)
        ports = [wait_until(f"rank {r}'s UCX listener", lambda: ucx_ports(h, r), procs)
                 for r in range(WORLD)]
        outside = forge_all(h, [(WORLD, h.addr[r], p, 10) for r in range(WORLD)
                                for _, p in ports[r]])
        alive = [p.poll() is None for p in procs]
        codes, _ = hosts.wait_all(procs, 180)
        texts = [read(o) for o in outs]
    print(f"  from outside the job's hosts, no filter: forged endpoints {outside}")
    assert codes == [0] * WORLD, f"exit codes {codes}:\n" + "\n".join(texts)
    assert all(alive), f"the job ended before the stranger was done ({alive}): more steps"
    for code, line in outside:
        assert code == 0 and "flushed (UCX accepted the connection)" in line, (code, line)
    assert "forged" not in "".join(texts), "\n".join(texts)
    acc = summary(m)["final_test_accuracy"]
    print(f"  test accuracy {100 * acc:.2f}%")
    assert acc >= 0.78, acc  # 87.3% at these steps with the filter on (above)


def main():
    why = hosts.skip_reason()
    if not why and not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        why = f"the Fashion-MNIST data set is not installed ({DATA})"
    if why:
        print(f"skipped: {why}")
        return 77
    failed = 0
    with tempfile.TemporaryDirectory(prefix="distopt_netns_") as tmp:
        only = os.environ.get("NETNS_TEST_FILTER", "")  # a substring of the cases to run
        for name, fn in [(k, v) for k, v in globals().items() if k.startswith("test_")]:
            if only not in name:
                continue
            print(f"{name}:", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"  ok ({time.time() - t0:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 -- report every case
                failed += 1
                print(f"  FAILED ({time.time() - t0:.1f} s): {type(e).__name__}: {e}", flush=True)
    print(f"{failed} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
