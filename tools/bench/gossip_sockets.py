#!/usr/bin/python3
"""What plain TCP sockets get out of the shaped links for gossip's exchange
patterns: the anchor for the decentralized rows of compare_decentralized.py
--netns-rate (gossip at the link rate).

N ranks, one per network namespace (tools/netns/hosts.py: veth + bridge, tc
tbf RATE per link and direction). Each rank is a Python process with a TCP
connection to every other (TCP_NODELAY, kernel-autotuned buffers), and each
round starts on a barrier, then times these patterns of BYTES per message:
  ring_at_once      send to both ring neighbours and receive from both, all
                    at once (threads): two flows share each link direction
  ring_one_at_a_time  send left while receiving from the right, then the
                    other way (one flow per link direction)
  shift_one         one exchange with a partner that rotates every round
                    (Bagua's shift_one matching of the two halves)
The floor is the bytes a rank sends in a round at the link rate. Columns:
median, mean and 90th percentile of rank 0's round times over --rounds
rounds, and floor / mean. Needs root and iproute2.

    sudo tools/bench/gossip_sockets.py [--ranks 4] [--rate 100mbit] [--bytes 2143272]
"""
import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "netns"))
PORT = 23000  # the namespaces are fresh: nothing else listens there
PATTERNS = ["ring_at_once", "ring_one_at_a_time", "shift_one"]


def recv_all(conn, nbytes, buf=None):
    view = memoryview(buf if buf is not None else bytearray(nbytes))
    got = 0
    while got < nbytes:
        k = conn.recv_into(view[got:nbytes])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def rank_main(rank, n, addrs, pattern, nbytes, rounds):
    """One rank: connect to every other, run `rounds` rounds of `pattern`,
    rank 0 prints its round times in ms (one line)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addrs[rank], PORT))
    srv.listen(n)
    conns = {}

    def accept():
        for _ in range(rank):
            c, _ = srv.accept()
            conns[struct.unpack("i", recv_bytes(c, 4))[0]] = c

    def recv_bytes(c, k):
        b = bytearray(k)
        recv_all(c, k, b)
        return bytes(b)

    t = threading.Thread(target=accept)
    t.start()
    for p in range(rank + 1, n):
        for _ in range(600):
            try:
                s = socket.create_connection((addrs[p], PORT))
                break
            except OSError:
                time.sleep(0.05)
        s.sendall(struct.pack("i", rank))
        conns[p] = s
    t.join()
    for c in conns.values():
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = bytearray(nbytes)
    inbox = {p: bytearray(nbytes) for p in conns}
    left, right = (rank - 1) % n, (rank + 1) % n

    def exchange(sends, recvs):
        threads = [threading.Thread(target=conns[p].sendall, args=(out,)) for p in sends]
        threads += [threading.Thread(target=recv_all, args=(conns[p], nbytes, inbox[p]))
                    for p in recvs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    times = []
    for r in range(rounds + 2):  # the first two warm the connections up
        for c in conns.values():  # barrier: a byte to and from everyone
            c.sendall(b"b")
        for c in conns.values():
            recv_bytes(c, 1)
        t0 = time.perf_counter()
        if pattern == "ring_at_once":
            exchange({left, right}, {left, right})
        elif pattern == "ring_one_at_a_time":
            exchange([left], [right])
            exchange([right], [left])
        else:
            half = n // 2
            p = (half + (r + rank) % half) if rank < half else (rank - half - r) % half
            exchange([p], [p])
        if r >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        print(" ".join(f"{x:.2f}" for x in times), flush=True)


def measure(hosts, pattern, nbytes, rounds):
    """Run `pattern` with `nbytes` per message for `rounds` rounds between
    the ranks of `hosts` (a tools/netns/hosts.py Hosts, one rank per
    namespace, already up): rank 0's round times in ms, sorted. Exits
    naming the pattern when rank 0 fails."""
    n = len(hosts.addr)
    procs = [subprocess.Popen(hosts.argv(i, [sys.executable, os.path.abspath(__file__),
                                             "--bytes", str(nbytes), "--rank-main", str(i),
                                             str(n), ",".join(hosts.addr), pattern,
                                             str(rounds)]),
                              stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                              text=True) for i in range(n)]
    out = procs[0].communicate(timeout=600)[0]
    for p in procs[1:]:
        p.wait(timeout=60)
    if procs[0].returncode != 0 or not out.strip():
        sys.exit(f"{pattern}: rank 0 failed (exit {procs[0].returncode})")
    return sorted(float(x) for x in out.split())


def floor_ms(pattern, nbytes, rate_bits_s):
    """The bytes a rank sends in one round of `pattern`, at the link rate, in ms."""
    return nbytes * (2 if pattern.startswith("ring") else 1) * 8 / rate_bits_s * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--bytes", type=int, default=2143272,
                    help="bytes per message (default: the mlp's float32 parameters)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--patterns", nargs="+", default=PATTERNS, choices=PATTERNS)
    ap.add_argument("--rank-main", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        rank, n, addrs, pattern, rounds = a.rank_main
        rank_main(int(rank), int(n), addrs.split(","), pattern, a.bytes, int(rounds))
        return
    import hosts as netns_hosts  # tools/netns/hosts.py
    why = netns_hosts.skip_reason()
    if why:
        sys.exit(f"gossip_sockets.py: {why}")
    if a.ranks < 3 or a.ranks % 2:
        sys.exit("--ranks: an even number >= 4 (a ring with two distinct neighbours, shift_one)")
    rate = netns_hosts.rate_bits(a.rate)
    print(f"# plain TCP sockets, {a.ranks} ranks in network namespaces, tc tbf {a.rate} per link "
          f"and direction, {a.bytes} bytes per message, {a.rounds} rounds (rank 0's times)")
    print(f"{'pattern':20} {'median ms':>10} {'mean ms':>8} {'p90 ms':>8} {'floor ms':>9} "
          f"{'floor/mean':>10}")
    for pattern in a.patterns:
        with netns_hosts.Hosts(a.ranks, rate=a.rate) as h:
            t = measure(h, pattern, a.bytes, a.rounds)
        floor = floor_ms(pattern, a.bytes, rate)
        mean = statistics.mean(t)
        print(f"{pattern:20} {statistics.median(t):10.1f} {mean:8.1f} "
              f"{t[int(0.9 * (len(t) - 1))]:8.1f} {floor:9.1f} {floor / mean:9.0%}")


if __name__ == "__main__":
    main()
