"""Shared pieces of the real-process swarm tests: tiny configs, launching, waiting, leak checks."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

from p2p_trainer.cli import to_toml
from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.local import LocalOptions
from p2p_trainer.metrics import read_records


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


def sockets() -> set[str]:
    return set(glob.glob("/tmp/hivemind-p2p*.sock"))


def rounds_of(run_dir: Path, i: int) -> list[dict[str, object]]:
    return [r for r in read_records(run_dir / f"peer{i}" / "metrics.jsonl") if r.get("kind") == "round"]


def final_of(run_dir: Path, i: int) -> dict[str, object] | None:
    return next(
        (r for r in read_records(run_dir / f"peer{i}" / "metrics.jsonl") if r.get("kind") == "final"), None
    )


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
