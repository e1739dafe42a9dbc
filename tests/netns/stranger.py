#!/usr/bin/python3
"""A process without the job's token that talks to a job's sockets (run in
another network namespace by netns_test.py). Prints one JSON object with
what it got back.

  stranger.py store HOST PORT          # the rendezvous store
  stranger.py tcp-hello HOST PORT      # a tcp communicator's listener
  stranger.py junk HOST PORT           # any port: random bytes, then a
                                       # UCX-looking stream
"""
import json
import os
import socket
import struct
import sys

TIMEOUT_S = 5


def connect(host, port, timeout_s=TIMEOUT_S):
    s = socket.create_connection((host, port), timeout=timeout_s)
    s.settimeout(TIMEOUT_S)
    return s


def read_all(s, limit=1 << 16, timeout_s=TIMEOUT_S):
    """Everything the peer sends until it closes (or the timeout)."""
    s.settimeout(timeout_s)
    got = b""
    try:
        while len(got) < limit:
            b = s.recv(4096)
            if not b:
                return got, "closed"
            got += b
    except socket.timeout:
        return got, "timeout"
    except ConnectionResetError:
        return got, "reset"
    return got, "limit"


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def s32(b):
    return struct.pack("<I", len(b)) + b


def store(host, port):
    """The store's wire format (core/src/store/tcp_store.cpp): frames of u32
    length + payload; HELLO = op 1, magic, token; SET = 2, GET = 3."""
    out = {}
    tries = {
        # A wrong token, then a SET and a GET on the same connection.
        "wrong_token": frame(b"\x01" + s32(b"distopt-store-v1") + s32(b"not-the-token")) +
        frame(b"\x02" + s32(b"stranger/key") + s32(b"x")) +
        frame(b"\x03" + s32(b"comm/0/ucx/addr/0") + struct.pack("<q", 0)),
        # No hello at all: a GET of a key every job has.
        "no_hello": frame(b"\x03" + s32(b"comm/0/tcp/addr/0") + struct.pack("<q", 0)),
        # An empty token.
        "empty_token": frame(b"\x01" + s32(b"distopt-store-v1") + s32(b"")) +
        frame(b"\x03" + s32(b"comm/0/ucx/addr/0") + struct.pack("<q", 0)),
    }
    for name, data in tries.items():
        s = connect(host, port)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got, how = read_all(s)
        s.close()
        out[name] = {"reply": got.hex(), "end": how}
    return out


def tcp_hello(host, port):
    """plugins/tcp/mesh.cpp's hello: magic DOPTTCP1, u32 token length,
    token, u32 scope length, scope, u32 rank, u8 channel; 'K' accepts."""
    out = {}
    hello = (b"DOPTTCP1" + s32(b"wrong-token") + s32(b"comm/0") + struct.pack("<I", 2) + b"\x00")
    for name, data in {"wrong_token": hello, "bad_magic": b"GET / HTTP/1.0\r\n\r\n"}.items():
        s = connect(host, port)
        s.sendall(data + os.urandom(64))
        got, how = read_all(s)
        s.close()
        out[name] = {"reply": got.hex(), "end": how}
    return out


def junk(host, port):
    """Random bytes; then UCT tcp's magic number (0xcafebabe12345678, what a
    UCX tcp endpoint sends first) followed by random bytes."""
    out = {}
    ucx_magic = struct.pack("<Q", 0xCAFEBABE12345678)
    for name, data in {"random": os.urandom(4096),
                       "ucx_magic": ucx_magic + os.urandom(4096)}.items():
        try:
            s = connect(host, port, timeout_s=2)
            s.sendall(data)
            got, how = read_all(s, timeout_s=1)  # UCX may just wait for more
            s.close()
        except OSError as e:
            got, how = b"", f"error: {e}"
        out[name] = {"reply_bytes": len(got), "end": how}
    return out


def main():
    what, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fn = {"store": store, "tcp-hello": tcp_hello, "junk": junk}[what]
    print(json.dumps(fn(host, port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
