#!/usr/bin/python3
"""Hosts in network namespaces: N namespaces, each with its own address on
a private /24, joined by veth pairs through one bridge, so that processes
started in them talk over a real (virtual) network instead of loopback. Used
by tests/netns/netns_test.py and tools/bench/compare_decentralized.py.

Each link can be rate-limited with tc `tbf` in both directions (the
namespace's eth0 egress: its upload; the bridge port's egress: its
download), like a host with a full-duplex NIC of that rate on a
non-blocking switch. A delay needs `netem`, which not every kernel has:
without it the delay is left out and `notes` says so.

Names carry a random suffix and the creating pid, so concurrent runs do not
collide, and `cleanup_stale()` removes what a killed run left behind.
Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; `skip_reason()`
says why not.

    with Hosts(3, rate="1gbit") as h:          # h.ns[i], h.addr[i], h.link[i]
        subprocess.run(h.argv(0, ["ip", "addr"], {"X": "1"}))
        procs, outs = h.launch(["build/bin/distopt", "train", "job.yaml"], out_dir)
        h.link_down(2)                          # cut host 2 off the bridge
        codes, seconds = wait_all(procs, 60)

    tools/netns/hosts.py run -n 3 --rate 1gbit -- CMD...   # $NETNS_NAMES, _ADDRS, _LINKS
    tools/netns/hosts.py cleanup                            # what killed runs left
"""
import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "distopt"  # namespaces: distopt-<hex>-<pid>-<i>; bridge dnb<hex>; veths dn<hex>h<i>


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def skip_reason():
    """None when namespaces can be built here, else why not (one line)."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if not shutil.which("ip"):
        return "`ip` (iproute2) is not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` fails: {r.stderr.strip()}"
    try:
        r = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if r.returncode != 0:
            return f"cannot create veth pairs: {r.stderr.strip()}"
        r = _ip("-n", probe, "link", "add", "b0", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"cannot create bridges: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_processes(ns):
    """SIGKILL the processes inside network namespace `ns` (one of ours)."""
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    if pids:
        time.sleep(0.1)


def cleanup_stale():
    """Delete the namespaces (and what still runs in them) and bridges of
    runs whose creating process is gone (killed before it could clean up)."""
    for name in _ip("netns", "list", check=False).stdout.split():
        parts = name.split("-")
        if len(parts) == 4 and parts[0] == PREFIX and parts[2].isdigit():
            if not _pid_alive(int(parts[2])):
                kill_processes(name)
                _ip("netns", "del", name, check=False)
                _ip("link", "del", "dnb" + parts[1], check=False)


class Hosts:
    """N namespaces on one bridge. `ns[i]`: the namespace name, `addr[i]`:
    its IPv4 address, `link[i]`: its bridge-side veth (what `link_down`
    takes down). rate: a tc rate ("1gbit", "100mbit") or None; delay: a
    netem delay ("1ms") or None. Use as a context manager: the namespaces,
    the bridge and every process still inside them go away on exit, also
    on an exception, SIGTERM or SIGINT."""

    def __init__(self, n, rate=None, delay=None):
        self.n, self.rate, self.delay = n, rate, delay
        self.tag = secrets.token_hex(3)
        self.bridge = "dnb" + self.tag
        self.ns = [f"{PREFIX}-{self.tag}-{os.getpid()}-{i}" for i in range(n)]
        self.link = [f"dn{self.tag}h{i}" for i in range(n)]
        subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}"
        self.addr = [f"{subnet}.{i + 1}" for i in range(n)]
        self.notes = []
        self.port = self.token = None  # the last launch's rendezvous port and job token
        self._old_handlers = {}

    # -- set-up and tear-down --------------------------------------------
    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _on_signal(self, signum, _frame):
        self.close()
        sys.exit(128 + signum)

    def _create(self):
        cleanup_stale()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, (ns, link) in enumerate(zip(self.ns, self.link)):
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", link, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        if self.rate or self.delay:
            if not shutil.which("tc"):
                raise RuntimeError("`tc` (iproute2) is not installed: cannot shape the links")
            for i in range(self.n):
                self._shape(["tc", "-n", self.ns[i], "qdisc", "add", "dev", "eth0", "root"])
                self._shape(["tc", "qdisc", "add", "dev", self.link[i], "root"])

    def _shape(self, cmd):
        if self.delay and self._netem_ok(cmd):
            return
        if self.rate:
            # Burst: 1 ms at the rate, at least 64 KiB (veth hands tbf GSO
            # packets of up to 64 KiB); the queue holds 20 ms.
            bits = rate_bits(self.rate)
            burst = max(65536, bits // 8 // 1000)
            _run(cmd + ["tbf", "rate", self.rate, "burst", str(burst), "latency", "20ms"])

    def _netem_ok(self, cmd):
        extra = ["rate", self.rate] if self.rate else []
        r = subprocess.run(cmd + ["netem", "delay", self.delay] + extra, capture_output=True,
                           text=True)
        if r.returncode == 0:
            return True
        note = (f"netem is not available ({r.stderr.strip()}): no delay added" +
                (", rate via tbf only" if self.rate else ""))
        if note not in self.notes:
            self.notes.append(note)
        return False

    def close(self):
        """Kill what runs inside, delete the namespaces (and with them the
        veth pairs) and the bridge. Idempotent."""
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)
        self._old_handlers = {}
        for ns, link in zip(self.ns, self.link):
            kill_processes(ns)
            _ip("link", "del", link, check=False)  # now, not when the kernel reaps the namespace
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)

    # -- use --------------------------------------------------------------
    def argv(self, i, argv, env=None):
        """The command line that runs `argv` in host i, with `env` added."""
        pre = ["ip", "netns", "exec", self.ns[i]]
        if env:
            pre += ["env"] + [f"{k}={v}" for k, v in env.items()]
        return pre + list(argv)

    def launch(self, argv, out_dir, enter=None, world=None):
        """Start `argv` once per host as one distopt rank each: DISTOPT_RANK,
        DISTOPT_WORLD_SIZE, DISTOPT_LOCAL_RANK 0 of 1, DISTOPT_RENDEZVOUS on
        host 0's address (a random port: the namespace is fresh, kept in
        `port`), a random DISTOPT_JOB_TOKEN (kept in `token`),
        DISTOPT_BIND_ADDRESS its own address. Output of rank r goes to
        out_dir/rank<r>.out. enter(i): another command prefix that enters
        host i (default `ip netns exec`). world: ranks on hosts 0..world-1
        only (default all; the others stay free for strangers). Returns
        (processes, output paths)."""
        port, token = 20000 + secrets.randbelow(40000), secrets.token_hex(8)
        self.port, self.token = port, token
        world = world or self.n
        procs, outs = [], []
        for r in range(world):
            env = {"DISTOPT_RANK": r, "DISTOPT_WORLD_SIZE": world, "DISTOPT_LOCAL_RANK": 0,
                   "DISTOPT_LOCAL_WORLD_SIZE": 1, "DISTOPT_RENDEZVOUS": f"tcp://{self.addr[0]}:{port}",
                   "DISTOPT_JOB_TOKEN": token, "DISTOPT_BIND_ADDRESS": self.addr[r]}
            if enter:
                cmd = enter(r) + ["env"] + [f"{k}={v}" for k, v in env.items()] + list(argv)
            else:
                cmd = self.argv(r, argv, env)
            outs.append(os.path.join(out_dir, f"rank{r}.out"))
            with open(outs[-1], "w") as f:
                procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT))
        return procs, outs

    def listening(self, i):
        """The TCP ports listened on in host i: [(address, port, pid)]."""
        r = subprocess.run(["ip", "netns", "exec", self.ns[i], "ss", "-ltnpH"],
                           capture_output=True, text=True, check=True)
        out = []
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) < 4:
                continue
            addr, _, port = f[3].rpartition(":")
            pid = line.partition("pid=")[2].partition(",")[0]
            out.append((addr.strip("[]"), int(port), int(pid) if pid.isdigit() else None))
        return out

    def link_down(self, i):
        """Cut host i off the bridge (its bridge-side veth goes down: no RST,
        no FIN, packets are simply lost, as with a pulled cable)."""
        _ip("link", "set", self.link[i], "down")

    def link_up(self, i):
        _ip("link", "set", self.link[i], "up")


def wait_all(procs, timeout_s):
    """Exit codes and seconds until each process ended (None: still running
    after timeout_s; Hosts.close() kills it)."""
    t0, codes, secs = time.time(), [None] * len(procs), [None] * len(procs)
    while time.time() - t0 < timeout_s and None in codes:
        for i, p in enumerate(procs):
            if codes[i] is None and p.poll() is not None:
                codes[i], secs[i] = p.returncode, time.time() - t0
        time.sleep(0.05)
    return codes, secs


def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def rate_bits(rate):
    """'1gbit' -> 1e9 (tc's units for bits per second)."""
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for u, m in units.items():
        if rate.endswith(u):
            return int(float(rate[: -len(u)]) * m)
    raise ValueError(f"rate '{rate}': use NNgbit, NNmbit or NNkbit")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build the hosts, run CMD, tear them down")
    r.add_argument("-n", type=int, default=3)
    r.add_argument("--rate", help="per-link rate, e.g. 1gbit (tc tbf)")
    r.add_argument("--delay", help="per-link delay, e.g. 1ms (needs netem)")
    r.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("cleanup", help="remove what killed runs left behind")
    a = ap.parse_args()
    why = skip_reason()
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 77
    if a.cmd == "cleanup":
        cleanup_stale()
        return 0
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    with Hosts(a.n, a.rate, a.delay) as h:
        for note in h.notes:
            print(note, file=sys.stderr)
        env = dict(os.environ, NETNS_NAMES=" ".join(h.ns), NETNS_ADDRS=" ".join(h.addr),
                   NETNS_LINKS=" ".join(h.link))
        return subprocess.run(cmd or ["true"], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
