"""Bandwidth and latency of the link between two hosts, as a stage's output crosses it. Stdlib only.

    python -c <this file> serve ADDRESS            # prints its port, serves one connection, exits
    python -c <this file> send ADDRESS PORT BYTES  # prints one JSON line

The sender first exchanges small pings (round-trip time, halved: latency), then
streams BYTES and waits for the receiver's acknowledgement: bytes / seconds is
what a stage-to-stage send of that size gets.

Each end also says what a byte costs its host's compute (`send_s_per_byte`,
`recv_s_per_byte`): the CPU time its process spent on the stream, times the wall
time one CPU second takes on that host (a short spin: 1 on a free core, 1 / q under
a CFS quota of q cores). A slow link is not only slow: the bytes arrive a few
packets at a time, each a wake-up and a system call, and on a quota-bound host that
CPU is taken from the stage's compute. Measured on a 0.4-core host behind a
100 Mbit/s token bucket, receiving cost 20 ns of CPU a byte against 1 ns unshaped.
"""

import json
import socket
import struct
import sys
import time

PINGS = 20
BLOCK = 1 << 16
SPIN_S = 0.2
"""Wall time of the spin that finds the wall time one CPU second takes here."""


def wall_per_cpu_s() -> float:
    """Wall seconds per CPU second for one busy thread on this host now (about 1 / q under a quota of q < 1
    cores; above 1 also when other work holds the cores)."""
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    while time.perf_counter() - wall0 < SPIN_S:
        pass
    return (time.perf_counter() - wall0) / max(time.thread_time() - cpu0, 1e-6)


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
            scale = wall_per_cpu_s()
            size = int.from_bytes(_recv_exact(conn, 8), "big")
            cpu0 = time.process_time()
            left = size
            while left:
                chunk = conn.recv(min(BLOCK * 4, left))
                if not chunk:
                    raise ConnectionError("sender closed early")
                left -= len(chunk)
            # The acknowledgement carries what receiving cost this host's compute, per byte.
            conn.sendall(b"k" + struct.pack("!d", (time.process_time() - cpu0) * scale / max(size, 1)))


def send(address: str, port: int, size: int) -> None:
    with socket.create_connection((address, port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            sock.sendall(b"p")
            _recv_exact(sock, 1)
            rtts.append(time.perf_counter() - t0)
        scale = wall_per_cpu_s()
        payload = b"\0" * BLOCK
        t0, cpu0 = time.perf_counter(), time.process_time()
        sock.sendall(size.to_bytes(8, "big"))
        left = size
        while left:
            n = min(BLOCK, left)
            sock.sendall(payload[:n])
            left -= n
        ack = _recv_exact(sock, 9)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rtts.sort()
    print(json.dumps({"latency_s": rtts[len(rtts) // 2] / 2, "bytes": size, "seconds": seconds,
                      "bytes_per_s": size / seconds, "send_s_per_byte": cpu * scale / max(size, 1),
                      "recv_s_per_byte": struct.unpack("!d", ack[1:])[0], "wall_per_cpu_s": scale}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
