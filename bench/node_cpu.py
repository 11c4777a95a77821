"""Where a peer's CPU goes besides training: each process of a local swarm, from /proc.

Starts `p2p-trainer local`-style swarm (bootstrap + N `join` peers of one method, default model),
waits until every peer has trained a round, then samples user + system time of every process in
each peer's tree for `--window-s` and prints cores per role: the training process (all its
threads), its hivemind DHT process, its p2pd, the state-server reaper. Under a CPU cap of C cores,
whatever the other roles take is that share of C lost to training.

    .venv/bin/python -m bench.node_cpu [--peers 4] [--method independent] [--window-s 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from p2p_trainer import processes
from p2p_trainer.config import load_config
from p2p_trainer.round_log import read_log
from p2p_trainer.run.launcher import LocalSwarm, local_options

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
STARTUP_TIMEOUT_S = 180.0


def cpu_ticks(pid: int) -> int:
    """User + system clock ticks of `pid` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def role(pid: int, peer_pid: int) -> str:
    if pid == peer_pid:
        return "training process"
    argv = " ".join(processes.cmdline(pid))
    if "p2pd" in argv:
        return "p2pd"
    if "reaper" in argv:
        return "reaper"
    if "torch_shm_manager" in argv:
        return "torch_shm_manager"
    return "DHT process" if "p2p_trainer" in argv else Path(argv.split(" ")[0] or "?").name


def sample(peer_pids: list[int], window_s: float) -> dict[str, list[float]]:
    """Cores per role over `window_s`, one value per peer."""
    trees = {p: {p} | processes.descendants(p) for p in peer_pids}
    before = {pid: cpu_ticks(pid) for tree in trees.values() for pid in tree}
    time.sleep(window_s)
    cores: dict[str, list[float]] = {}
    for peer, tree in trees.items():
        per_role: dict[str, float] = {}
        for pid in tree:
            used = (cpu_ticks(pid) - before[pid]) / TICKS_PER_S / window_s
            per_role[role(pid, peer)] = per_role.get(role(pid, peer), 0.0) + max(0.0, used)
        for name, value in per_role.items():
            cores.setdefault(name, []).append(value)
    return cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--method", default="independent")
    ap.add_argument("--window-s", type=float, default=30.0)
    ap.add_argument("--cap-cores", type=float, default=0.45, help="The cap to express the cost against.")
    args = ap.parse_args()
    cfg = load_config(method=args.method)  # the packaged default run, as `local --method` runs it
    with tempfile.TemporaryDirectory(prefix="node-cpu-") as tmp:
        run_dir = Path(tmp)
        # long enough that no peer stops inside the window, however slowly they all start
        limit_s = STARTUP_TIMEOUT_S + args.window_s + 60
        opts = local_options(run_dir, cfg, args.peers, max_minutes=limit_s / 60)
        with LocalSwarm(opts) as swarm:
            swarm.start_bootstrap()
            children = [swarm.start_peer(i) for i in range(args.peers)]
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            logs = [run_dir / f"peer{i}" / "metrics.jsonl" for i in range(args.peers)]
            while not all(log.exists() and read_log(log).rounds for log in logs):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the peers did not all train a round within {STARTUP_TIMEOUT_S:.0f} s")
                time.sleep(1.0)
            cores = sample([c.pid for c in children], args.window_s)
            if any(c.proc.poll() is not None for c in children):
                raise SystemExit("a peer stopped inside the window: its cores would read low")
    print(f"{args.peers} peers, method {args.method}, {args.window_s:.0f} s window; cores per peer:")
    for name, values in sorted(cores.items(), key=lambda kv: -statistics.median(kv[1])):
        med = statistics.median(values)
        share = (
            "" if name == "training process" else f"  ({med / args.cap_cores:.1%} of a {args.cap_cores} cap)"
        )
        print(f"  {name:18s} {med:.4f} ({min(values):.4f}–{max(values):.4f}){share}")
    print(f"1-minute load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
