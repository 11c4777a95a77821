"""Where an exchange's time goes on the WAN testbed: our butterfly (over the direct data plane and
over p2pd) vs plain TCP vs the bound.

    python -m bench.exchange_profile [--peers 2 4] [--rounds 6] [--chunks C]

The target is exchange time <= 1.15 x bytes / link rate (bench/RESULTS.md). The WAN bench's per-peer
`elapsed_s` also counts waiting for the group's last member, so this bench takes the peers out and
times the exchange itself: N member processes (hivemind DHT + p2pd + our Transport, the real
stack, its messages over the direct data plane or over p2pd streams), each in its own namespace on a capped link and CPU quota, run `butterfly_average` on the
default model's parameter count at start times agreed in advance (the hosts share one clock).
Per exchange it reports the member-averaged time from its own start (the same moment for all) to
its own result, against the bound, in four conditions:

- idle: the members do nothing else (DiLoCo's blocking exchange);
- busy: each member also runs the default model's training steps in its main thread, as during
  factored gossip's non-blocking Mix1 (the transport's loop thread and p2pd share the quota);
- a plain TCP stream of the same bytes per host (the testbed's own floor, no p2pd).

Prints ratios against the bound and against plain TCP, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GROUP_KEY = "exchange-profile"


# ------------------------------------------------------------------------------------------- member
def _busy_training(stop: threading.Event, steps: list[float]) -> None:
    """The default model's inner steps on random bytes, single-threaded, until `stop`."""
    import torch

    from p2p_trainer.config import ModelConfig
    from p2p_trainer.train.model import build_model

    torch.set_num_threads(1)
    cfg = ModelConfig()
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    while not stop.is_set():
        t0 = time.monotonic()
        x = torch.randint(0, cfg.vocab_size, (16, cfg.seq_len + 1), generator=gen)
        loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps.append(time.monotonic() - t0)


async def _chunked(transport: Any, group: Any, flat: Any, deadline: float, chunks: int) -> Any:
    """`--chunks`: a pipelined exchange built from the shipped butterfly. The vector is cut into
    consecutive chunks, each averaged by a butterfly of its own; chunk c + 1's starts once chunk
    c's contributions are delivered, so its phase 1 runs while chunk c's results come back."""
    import asyncio
    import dataclasses

    from p2p_trainer.exchange.interface import Ok
    from p2p_trainer.net.allreduce import butterfly_average, part_bounds

    started = time.monotonic()
    ready = [asyncio.Event() for _ in range(chunks)]

    async def one(c: int, a: int, b: int) -> Any:
        if c:
            await ready[c - 1].wait()
        g = dataclasses.replace(group, key=f"{group.key}|k{c}", view_prefix=f"{group.key}|k{c}")
        return await butterfly_average(transport, g, flat[a:b], 1.0, deadline, contributed=ready[c].set)

    bounds = part_bounds(flat.numel(), chunks)
    results = await asyncio.gather(*(one(c, a, b) for c, (a, b) in enumerate(bounds)))
    failed = [r for r in results if not isinstance(r, Ok)]
    if failed:
        return failed[0]
    return dataclasses.replace(
        results[0],
        group_size=min(r.group_size for r in results),
        elapsed_s=time.monotonic() - started,
        quorum_s=results[0].quorum_s,
        sync_s=results[-1].sync_s,
    )


def member(args: argparse.Namespace) -> int:
    import hivemind
    import numpy as np
    import torch
    from hivemind.utils import get_dht_time

    from p2p_trainer.exchange.interface import Ok
    from p2p_trainer.net.allreduce import GroupSpec, butterfly_average
    from p2p_trainer.net.direct import format_address
    from p2p_trainer.net.envelope import Signer
    from p2p_trainer.net.identity import load_or_create_identity, load_signing_key
    from p2p_trainer.net.transport import Transport

    # the direct data plane's sender is the identity key's peer id: p2pd must run with that key
    key_dir = tempfile.mkdtemp(prefix="exchange-profile-")
    identity = load_or_create_identity(Path(key_dir) / "member.key")
    dht = hivemind.DHT(
        initial_peers=args.initial_peer,
        host_maddrs=[f"/ip4/0.0.0.0/tcp/{args.port}"],
        announce_maddrs=[f"/ip4/{args.address}/tcp/{args.port}"],
        identity_path=str(identity.path),
        check_if_identity_free=False,  # hivemind's check assumes RSA keys
        start=True,
    )
    transport = Transport(
        dht, max_payload_bytes=4 * args.floats + 1024, signer=Signer(load_signing_key(identity))
    )
    data_address = ""
    if args.data_plane == "direct":
        data_address = format_address(args.address, transport.start_direct("0.0.0.0"))
    print(json.dumps({"maddrs": [str(m) for m in dht.get_visible_maddrs()]}), flush=True)
    dht.store(GROUP_KEY, [transport.peer_id, data_address], get_dht_time() + 600, subkey=args.index)
    members: list[str] = []
    addresses: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while len(members) < args.n and time.monotonic() < deadline:
        found = dht.get(GROUP_KEY, latest=True)
        addresses = dict(v.value for v in found.value.values()) if found is not None else {}
        members = sorted(addresses)
        time.sleep(0.2)
    transport.direct_address = lambda peer: addresses.get(peer) or None
    if len(members) < args.n:
        print(json.dumps({"error": f"saw {len(members)} of {args.n} members"}), flush=True)
        return 1
    stop = threading.Event()
    steps: list[float] = []
    if args.busy:
        threading.Thread(target=_busy_training, args=(stop, steps), daemon=True).start()
    flat = torch.from_numpy(np.random.default_rng(args.index).standard_normal(args.floats).astype(np.float32))
    cpu_at, faults_at = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for k in range(args.rounds):
        start_at = args.t0 + k * args.period_s
        time.sleep(max(0.0, start_at - time.time()))
        group = GroupSpec(key=f"{GROUP_KEY}|{k}", members=members, me=transport.peer_id)
        began = time.time()
        if args.chunks > 1:
            res = transport.run(
                _chunked(transport, group, flat, time.monotonic() + args.period_s, args.chunks),
                args.period_s + 5,
            )
        else:
            res = transport.run(
                butterfly_average(transport, group, flat, 1.0, time.monotonic() + args.period_s),
                args.period_s + 5,
            )
        row = {"round": k, "late_start_s": began - start_at, "elapsed_s": res.elapsed_s}
        row.update({"ok": res.group_size == args.n} if hasattr(res, "group_size") else {"ok": False})
        row["step_s"] = statistics.median(steps[-20:]) if steps else None
        # phase 1 (until the last contribution to this member's part) and phase 2 (its results)
        row.update({"quorum_s": res.quorum_s, "sync_s": res.sync_s} if isinstance(res, Ok) else {})
        # this process's CPU (every thread) since the last row: one period, idle time included, so
        # sends that finish after a result are counted with the next exchange
        row["cpu_s"], cpu_at = time.process_time() - cpu_at, time.process_time()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        row["page_faults"], faults_at = faults - faults_at, faults
        print(json.dumps(row), flush=True)
    stop.set()
    # this member has every result, but its own last results may still be on their way to the
    # others (sends finish in the background): closing now would cut them off mid-message
    time.sleep(5.0)
    transport.close()
    dht.shutdown()
    return 0


# ------------------------------------------------------------------------------------------- harness
def _members(
    tb: Any, n: int, busy: bool, rounds: int, floats: int, period_s: float, data_plane: str, chunks: int
) -> list[dict[str, Any]]:
    base = [sys.executable, str(Path(__file__).resolve()), "member", "--n", str(n), "--floats", str(floats)]
    base += ["--rounds", str(rounds), "--period-s", str(period_s), "--data-plane", data_plane]
    base += ["--busy"] if busy else []
    base += ["--chunks", str(chunks)]
    t0 = time.time() + 40.0  # DHT start, joins and the member list take ~15-25 s on 2 cores
    procs = []
    first_maddr: str | None = None
    for i in range(n):
        argv = [
            *base,
            "--index",
            str(i),
            "--address",
            tb.address(f"h{i}"),
            "--port",
            "31400",
            "--t0",
            str(t0),
        ]
        if first_maddr is not None:
            argv += ["--initial-peer", first_maddr]
        p = tb.run(f"h{i}", argv, env={"PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        if i == 0:
            line = p.stdout.readline()  # type: ignore[union-attr]
            maddrs = json.loads(line)["maddrs"]
            first_maddr = next(m for m in maddrs if tb.address("h0") in m)
    rows = []
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=t0 - time.time() + rounds * period_s + 60)
        for line in out.splitlines():
            r = json.loads(line)
            if "round" in r:
                rows.append({"member": i, **r})
            elif "error" in r:
                raise RuntimeError(f"member {i}: {r['error']}")
    return rows


def _median_of(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else math.nan


def _tcp_floor(tb: Any, n: int, nbytes: int) -> float:
    """Median over hosts of a plain TCP stream's time, all hosts sending at once (a ring)."""
    from concurrent.futures import ThreadPoolExecutor

    from p2p_trainer.lab.testbed import measure_transfer

    with ThreadPoolExecutor(max_workers=n) as pool:
        futs = [pool.submit(measure_transfer, tb, f"h{i}", f"h{(i + 1) % n}", nbytes) for i in range(n)]
        return statistics.median(f.result().elapsed_s for f in futs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode")
    m = sub.add_parser("member")
    for flag, typ in (("--n", int), ("--index", int), ("--floats", int), ("--rounds", int), ("--port", int)):
        m.add_argument(flag, type=typ, required=True)
    m.add_argument("--address", required=True)
    m.add_argument("--t0", type=float, required=True)
    m.add_argument("--period-s", type=float, required=True)
    m.add_argument("--initial-peer", action="append", default=[])
    m.add_argument("--busy", action="store_true")
    m.add_argument("--chunks", type=int, default=1)
    m.add_argument("--data-plane", choices=["direct", "p2pd"], default="direct")
    p.add_argument("--peers", type=int, nargs="+", default=[2, 4])
    p.add_argument(
        "--chunks", type=int, default=1, help="Pipeline each exchange in this many chunks (`_chunked`)."
    )
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rate-mbit", type=float, default=10.0)
    p.add_argument("--cpu-cores", type=float, default=0.45)
    p.add_argument(
        "--floats", type=int, default=837_888, help="Vector length (default: the default model's)."
    )
    p.add_argument(
        "--data-planes", nargs="+", choices=["direct", "p2pd"], default=["direct", "p2pd"],
        help="Routes of the butterfly's messages to measure (net/direct.py, or p2pd streams).",
    )  # fmt: skip
    p.add_argument(
        "--conditions", dest="busy", nargs="+", type=lambda c: {"idle": False, "busy": True}[c],
        default=[False, True], help="idle, busy or both (default).",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="Write the rows and summary here as JSON.")
    args = p.parse_args()
    if args.mode == "member":
        return member(args)

    from bench.wan.analysis import bound_s as link_bound_s
    from bench.wan.analysis import pair_bytes
    from p2p_trainer.lab.testbed import Testbed, TestbedConfig, support_problem
    from p2p_trainer.lab.testbed.layout import HostSpec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    problem = support_problem()
    if problem is not None:
        print(f"cannot run the WAN testbed here: {problem}")
        return 2
    summary = []
    for n in args.peers:
        nbytes = pair_bytes(n, args.floats)  # each way, per member (docs/algorithms.md §8)
        bound_s = link_bound_s(n, args.floats, args.rate_mbit)
        period = 2.5 * bound_s + 3.0
        hosts = tuple(HostSpec(f"h{i}", args.rate_mbit, args.rate_mbit, args.cpu_cores) for i in range(n))
        with Testbed(TestbedConfig(hosts=hosts)) as tb:
            tcp_s = _tcp_floor(tb, n, int(nbytes))
            for plane, busy in [(plane, busy) for plane in args.data_planes for busy in args.busy]:
                rows = _members(tb, n, busy, args.rounds, args.floats, period, plane, args.chunks)
                # the first exchange also opens the members' connections: left out of the median
                steady = [r for r in rows if r["round"] > 0 and r["ok"]]
                el = statistics.median(r["elapsed_s"] for r in steady) if steady else float("nan")
                # each exchange, its members' time averaged: the slowest against the bound too
                per_exchange = [
                    statistics.fmean(r["elapsed_s"] for r in steady if r["round"] == k)
                    for k in sorted({r["round"] for r in steady})
                ]
                late = max((r["late_start_s"] for r in rows), default=0.0)
                step = statistics.median([r["step_s"] for r in steady if r["step_s"]] or [float("nan")])
                s = {
                    "peers": n, "condition": "busy" if busy else "idle", "data_plane": plane, "bytes_each_way": nbytes,
                    "bound_s": bound_s, "tcp_s": tcp_s, "exchange_s": el, "vs_bound": el / bound_s,
                    "vs_tcp": el / tcp_s, "tcp_vs_bound": tcp_s / bound_s, "ok": len(steady),
                    "of": len([r for r in rows if r["round"] > 0]), "max_late_start_s": late,
                    "busy_step_s": step if busy else None, "first_exchange_s": statistics.median(
                        r["elapsed_s"] for r in rows if r["round"] == 0),
                    # phase 1: until the last contribution to the member's own part; phase 2: its results
                    "quorum_s": _median_of(steady, "quorum_s"), "sync_s": _median_of(steady, "sync_s"),
                    "slowest_vs_bound": max(per_exchange, default=math.nan) / bound_s, "rows": rows,
                }  # fmt: skip
                summary.append(s)
                print(
                    f"{n} peers, {plane:>6}, {s['condition']:>4}: exchange {el:.2f} s = {s['vs_bound']:.2f} x bound "
                    f"({bound_s:.2f} s), {s['vs_tcp']:.2f} x plain TCP ({tcp_s:.2f} s = "
                    f"{s['tcp_vs_bound']:.2f} x bound); {s['ok']}/{s['of']} complete; first {s['first_exchange_s']:.2f} s"
                    + f"; phase 1 {s['quorum_s']:.2f} s, phase 2 {s['sync_s']:.2f} s (medians)"
                    + f"; slowest exchange {s['slowest_vs_bound']:.2f} x bound"
                    + (f"; busy step {step:.2f} s" if busy else ""),
                    flush=True,
                )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                        "summary": summary}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
