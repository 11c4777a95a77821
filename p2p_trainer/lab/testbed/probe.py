"""A tiny measurement program run inside testbed hosts (by file path, standard library only).

    python probe.py sink --port 5001            # prints {"ready": true}, then {"bytes": n, "elapsed_s": t}
    python probe.py send --host A --port 5001 --bytes N --timeout-s 30
                                                # prints {"bytes": n, "elapsed_s": t, "error": ...}
    python probe.py spin --seconds 2            # busy loop; prints {"cpu_s": c, "wall_s": w}
    python probe.py echo --port 5002            # prints {"ready": true}, echoes one connection
    python probe.py rtt --host A --port 5002 --count 20
                                                # prints {"rtt_ms": [...]}, 1-byte round trips

`send` times from the first byte written until the sink acknowledges having read everything, so
the time includes draining the link's queue. Each program writes one JSON line as its result.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

_CHUNK_BYTES = 1 << 16


def _emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def sink(port: int, timeout_s: float) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(timeout_s)
        _emit({"ready": True})
        conn, _ = server.accept()
        with conn:
            conn.settimeout(timeout_s)
            received, start = 0, time.monotonic()
            while chunk := conn.recv(_CHUNK_BYTES):
                received += len(chunk)
            elapsed_s = time.monotonic() - start
            conn.sendall(b"k")
    _emit({"bytes": received, "elapsed_s": elapsed_s})


def send(host: str, port: int, n_bytes: int, timeout_s: float) -> None:
    payload = b"\x5a" * _CHUNK_BYTES
    sent, start = 0, time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            start = time.monotonic()
            while sent < n_bytes:
                sent += conn.send(payload[: min(_CHUNK_BYTES, n_bytes - sent)])
            conn.shutdown(socket.SHUT_WR)
            ack = conn.recv(1)
        error = None if ack == b"k" else "no acknowledgement"
    except OSError as err:
        error = f"{type(err).__name__}: {err}"
    _emit({"bytes": sent, "elapsed_s": time.monotonic() - start, "error": error})


def echo(port: int, timeout_s: float) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(timeout_s)
        _emit({"ready": True})
        conn, _ = server.accept()
        with conn:
            conn.settimeout(timeout_s)
            while data := conn.recv(_CHUNK_BYTES):
                conn.sendall(data)


def rtt(host: str, port: int, count: int, timeout_s: float) -> None:
    samples_ms = []
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            start = time.monotonic()
            conn.sendall(b"p")
            if conn.recv(1) != b"p":
                raise ConnectionError("echo closed early")
            samples_ms.append((time.monotonic() - start) * 1000)
    _emit({"rtt_ms": samples_ms})


def spin(seconds: float) -> None:
    wall_start, cpu_start = time.monotonic(), time.process_time()
    counter = 0
    while time.monotonic() - wall_start < seconds:
        counter += 1
    _emit({"cpu_s": time.process_time() - cpu_start, "wall_s": time.monotonic() - wall_start})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    p_sink = sub.add_parser("sink")
    p_sink.add_argument("--port", type=int, required=True)
    p_sink.add_argument("--timeout-s", type=float, default=60.0)
    p_send = sub.add_parser("send")
    p_send.add_argument("--host", required=True)
    p_send.add_argument("--port", type=int, required=True)
    p_send.add_argument("--bytes", type=int, required=True)
    p_send.add_argument("--timeout-s", type=float, default=60.0)
    p_spin = sub.add_parser("spin")
    p_spin.add_argument("--seconds", type=float, required=True)
    p_echo = sub.add_parser("echo")
    p_echo.add_argument("--port", type=int, required=True)
    p_echo.add_argument("--timeout-s", type=float, default=60.0)
    p_rtt = sub.add_parser("rtt")
    p_rtt.add_argument("--host", required=True)
    p_rtt.add_argument("--port", type=int, required=True)
    p_rtt.add_argument("--count", type=int, default=20)
    p_rtt.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.mode == "echo":
        echo(args.port, args.timeout_s)
    elif args.mode == "rtt":
        rtt(args.host, args.port, args.count, args.timeout_s)
    elif args.mode == "sink":
        sink(args.port, args.timeout_s)
    elif args.mode == "send":
        send(args.host, args.port, args.bytes, args.timeout_s)
    else:
        spin(args.seconds)


if __name__ == "__main__":
    main()
