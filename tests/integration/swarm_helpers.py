"""Shared pieces of the real-process swarm tests: tiny configs, launching, waiting, leak checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig, to_toml
from p2p_trainer.round_log import FinalRecord, RoundRecord, read_log
from p2p_trainer.run.local_swarm import LocalOptions


def tiny_config(method: str, rounds: int, h: int = 5, **outer: float) -> RunConfig:
    return RunConfig(
        seed=0,
        rounds=rounds,
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32),
        data=DataConfig(batch_size=4, val_batches=2),
        inner=InnerConfig(eval_every=0, warmup_steps=2),
        outer=OuterConfig.for_method(method, num_inner_steps=h, exchange_timeout_s=30.0, **outer),
    )


def local_options(tmp: Path, cfg: RunConfig, peers: int) -> LocalOptions:
    path = tmp / "config.toml"
    path.write_text(to_toml(cfg))
    return LocalOptions(config_path=path, run=cfg, peers=peers, run_dir=tmp, torch_threads=1)


def _unix_paths_by_inode() -> dict[str, str]:
    with open("/proc/net/unix") as table:
        next(table)
        return {f[6]: f[7] for f in (line.split() for line in table) if len(f) >= 8}


def tree_pids(root: int) -> set[int]:
    """`root` and all its live descendants (whatever session or group they moved to)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parent.items() if p == pid and c not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


def held_sockets(roots: list[int]) -> set[str]:
    """hivemind socket files held open by these processes and their descendants.

    Taken while a test's processes run; after they stop, none of these files may remain. Only
    files of this test's own processes are checked, so other work on a shared machine cannot
    make the check fail or pass.
    """
    by_inode = _unix_paths_by_inode()
    paths = set()
    for root in roots:
        for pid in tree_pids(root):
            try:
                fds = list(Path(f"/proc/{pid}/fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:[") and target[8:-1] in by_inode:
                    paths.add(by_inode[target[8:-1]])
    return {p for p in paths if p.startswith("/tmp/hivemind-")}


def remaining(paths: set[str]) -> set[str]:
    return {p for p in paths if Path(p).exists()}


def rounds_of(run_dir: Path, i: int) -> list[RoundRecord]:
    return read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds


def final_of(run_dir: Path, i: int) -> FinalRecord | None:
    """Peer i's first final record (a peer that finished once never trains on)."""
    finals = read_log(run_dir / f"peer{i}" / "metrics.jsonl").finals
    return finals[0] if finals else None


def wait_until(predicate: object, timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(poll_s)
    return False


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def node_sockets(key_path: Path) -> set[Path]:
    """Socket files of the running p2pd that uses the identity `key_path` (daemon and client).

    Unlike a before/after glob of /tmp, this stays right while other swarms run on the machine.
    """
    found: set[Path] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if f"-id={key_path}" not in args:
            continue
        for arg in args:
            if arg.startswith("-listen=/unix") and "hivemind-p2pd-" in arg:
                daemon = Path(arg.removeprefix("-listen=/unix"))
                found |= {daemon, daemon.with_name(daemon.name.replace("p2pd", "p2pclient", 1))}
    return found
