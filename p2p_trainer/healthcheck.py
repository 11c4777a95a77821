"""Container healthchecks: `python -m p2p_trainer.healthcheck [--file F] [--tcp HOST:PORT] [--http URL]`.

Exit status 0 when every given check passes, else 1 with the failed check on stderr. Standard
library only, so a check every few seconds costs a fraction of a second and loads neither torch
nor hivemind. A bootstrap node is healthy once its address file exists (it is written only when
the node accepts connections) and its port answers; a peer, once its metrics endpoint answers.
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.request
from pathlib import Path


def check_file(path: str) -> str | None:
    """Why `path` does not count as written (missing or empty), or None."""
    try:
        return None if Path(path).read_text().strip() else f"{path} is empty"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"


def check_tcp(target: str, timeout_s: float) -> str | None:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return f"TCP {target}: {exc}"


def check_http(url: str, timeout_s: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return None if response.status == 200 else f"{url}: HTTP {response.status}"
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2p_trainer.healthcheck", description=__doc__)
    parser.add_argument("--file", action="append", default=[], help="must exist and not be empty")
    parser.add_argument("--tcp", action="append", default=[], help="HOST:PORT must accept a connection")
    parser.add_argument("--http", action="append", default=[], help="URL must answer 200")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    problems = [check_file(path) for path in args.file]
    problems += [check_tcp(target, args.timeout_s) for target in args.tcp]
    problems += [check_http(url, args.timeout_s) for url in args.http]
    failed = [p for p in problems if p is not None]
    for problem in failed:
        print(f"unhealthy: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
