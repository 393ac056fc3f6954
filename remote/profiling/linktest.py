"""Bandwidth and latency of the link between two hosts, as a stage's output crosses it. Stdlib only.

    python -c <this file> serve ADDRESS            # prints its port, serves one connection, exits
    python -c <this file> send ADDRESS PORT BYTES  # prints one JSON line

The sender first exchanges small pings (round-trip time, halved: latency), then
streams BYTES and waits for the receiver's acknowledgement: bytes / seconds is
what a stage-to-stage send of that size gets.
"""

import json
import socket
import sys
import time

PINGS = 20
BLOCK = 1 << 16


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(BLOCK, n - len(buf)))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def serve(address: str) -> None:
    with socket.create_server((address, 0)) as srv:
        srv.settimeout(60)
        print(srv.getsockname()[1], flush=True)
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(PINGS):
                conn.sendall(_recv_exact(conn, 1))
            size = int.from_bytes(_recv_exact(conn, 8), "big")
            left = size
            while left:
                chunk = conn.recv(min(BLOCK * 4, left))
                if not chunk:
                    raise ConnectionError("sender closed early")
                left -= len(chunk)
            conn.sendall(b"k")


def send(address: str, port: int, size: int) -> None:
    with socket.create_connection((address, port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            sock.sendall(b"p")
            _recv_exact(sock, 1)
            rtts.append(time.perf_counter() - t0)
        payload = b"\0" * BLOCK
        t0 = time.perf_counter()
        sock.sendall(size.to_bytes(8, "big"))
        left = size
        while left:
            n = min(BLOCK, left)
            sock.sendall(payload[:n])
            left -= n
        _recv_exact(sock, 1)
        seconds = time.perf_counter() - t0
    rtts.sort()
    print(json.dumps({"latency_s": rtts[len(rtts) // 2] / 2, "bytes": size, "seconds": seconds,
                      "bytes_per_s": size / seconds}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
