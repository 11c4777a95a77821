"""One exchange of the default model's pseudo-gradient on loopback: our butterfly vs a gloo all-reduce.

    python -m bench.loopback_vs_gloo [--peers 4] [--rounds 30] [--no-p2pd] [--out bench/results/loopback]

Both arms average the same float32 vector (837,888 values, the default model) among N processes
on this machine, with nothing else running. Ours, twice: messages over p2pd streams, then over the
direct data plane (`net/direct.py`, opt-in): N member processes of `bench.exchange_profile`
(hivemind DHT + p2pd + our Transport, the real stack) on 127.0.0.1, each exchange started at a
time agreed in advance and timed from that start to the member's own result. Gloo:
`torch.distributed` with the gloo backend over TCP on 127.0.0.1 (its default all-reduce
algorithm), `all_reduce` of the same vector after two warm-up calls, on the same schedule: each
call started at an agreed time, `--period-s` apart, and timed from it (until 6 Dec 2026 gloo's
calls ran back to back, hot, against our exchanges 5 s apart). The target (issue 13): ours ≤ 2 ×
gloo. Reports medians with min–max beside them, and each member's CPU per exchange period.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FLOATS = 837_888


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _gloo_worker(
    rank: int, world: int, port: int, floats: int, rounds: int, period_s: float, t0: float, out: Any
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.randn(floats, generator=torch.Generator().manual_seed(rank))
    dist.all_reduce(x.clone())  # the first calls set up connections
    dist.all_reduce(x.clone())
    times = []
    for k in range(rounds):
        # the same schedule as ours: every call starts at a time agreed in advance, `period_s`
        # apart, and is timed from that start (a rank that wakes late counts its lateness)
        y = x.clone()
        start_at = t0 + k * period_s
        time.sleep(max(0.0, start_at - time.time()))
        dist.all_reduce(y)
        y /= world
        times.append(time.time() - start_at)
    out.put((rank, times))
    dist.destroy_process_group()


def gloo(world: int, floats: int, rounds: int, period_s: float) -> list[float]:
    """Per call, the slowest rank's time from the agreed start."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    t0 = time.time() + 20.0  # process start and the group's set-up
    procs = [
        ctx.Process(target=_gloo_worker, args=(r, world, port, floats, rounds, period_s, t0, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    per_rank = dict(queue.get(timeout=60 + rounds * period_s) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return [max(per_rank[r][k] for r in per_rank) for k in range(rounds)]


def ours(
    n: int, floats: int, rounds: int, period_s: float, data_plane: str, cpu: list[float] | None = None
) -> list[float]:
    """Per exchange, the slowest member's time from the agreed start to its result; `cpu` gets
    each member's CPU per exchange period (every round but the first, which opens connections)."""
    base = [sys.executable, "-m", "bench.exchange_profile", "member", "--n", str(n), "--floats", str(floats)]
    base += ["--rounds", str(rounds), "--period-s", str(period_s), "--data-plane", data_plane]
    t0 = time.time() + 30.0  # DHT start, joins and the member list
    procs: list[subprocess.Popen[str]] = []
    first: str | None = None
    try:
        for i in range(n):
            argv = [*base, "--index", str(i), "--address", "127.0.0.1", "--port", str(_free_port())]
            argv += ["--t0", str(t0)] + (["--initial-peer", first] if first else [])
            p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            if i == 0:
                assert p.stdout is not None
                first = json.loads(p.stdout.readline())["maddrs"][0]
        rows: dict[int, list[float]] = {}
        faults: list[int] = []
        for p in procs:
            out, _ = p.communicate(timeout=t0 - time.time() + rounds * period_s + 60)
            for line in out.splitlines():
                r = json.loads(line)
                if "error" in r:
                    raise RuntimeError(r["error"])
                if "round" in r:
                    if not r["ok"]:
                        raise RuntimeError(f"exchange {r['round']} did not merge everyone: {r}")
                    rows.setdefault(r["round"], []).append(r["elapsed_s"] + max(0.0, r["late_start_s"]))
                    if cpu is not None and r["round"] > 0:
                        cpu.append(r["cpu_s"])
                        faults.append(r["page_faults"])
        if faults:
            print(f"  page faults per member and exchange period: {statistics.median(faults)} (median)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return [max(v) for _, v in sorted(rows.items())]


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}–{max(xs):.3f}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--floats", type=int, default=FLOATS)
    p.add_argument("--period-s", type=float, default=5.0, help="Time between our exchanges' starts.")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--no-p2pd",
        action="store_true",
        help="Leave out the butterfly over p2pd (the target is the direct plane's).",
    )
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    g = gloo(args.peers, args.floats, args.rounds, args.period_s)
    via_p2pd = [] if args.no_p2pd else ours(args.peers, args.floats, args.rounds, args.period_s, "p2pd")
    cpu: list[float] = []
    o = ours(args.peers, args.floats, args.rounds, args.period_s, "direct", cpu)
    ratio = statistics.median(o) / statistics.median(g)
    summary = {
        "peers": args.peers,
        "floats": args.floats,
        "rounds": args.rounds,
        "period_s": args.period_s,
        "gloo_s": g,
        "ours_s": o,
        "ours_p2pd_s": via_p2pd,
        "ratio_median": ratio,
        "cpu_per_member_exchange_s": cpu,
        "ratio_median_p2pd": statistics.median(via_p2pd) / statistics.median(g) if via_p2pd else None,
        "target": 2.0,
        "met": ratio <= 2.0,
        "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "machine": f"{platform.node()}, {os.cpu_count()} cores",
    }
    print(f"gloo all-reduce: {spread(g)}")
    if via_p2pd:
        print(f"ours, butterfly over p2pd streams: {spread(via_p2pd)}")
    print(f"ours, butterfly over the direct data plane (opt-in): {spread(o)}")
    print(f"  CPU per member and exchange period: {spread(cpu)}")
    print(f"ratio of medians: {ratio:.2f} (target <= 2.0: {'met' if ratio <= 2.0 else 'missed'})")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
