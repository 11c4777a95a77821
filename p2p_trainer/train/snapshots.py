"""Snapshots of a peer's anchor φ taken during a run, evaluated after it (benches' loss curves).

Saving costs a few milliseconds per snapshot and no evaluation, so loss-vs-time curves do not
steal training time. Each snapshot is one safetensors file; its metadata (round, step, tokens,
time) travels in the file's header, so a directory of snapshots is self-describing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


@dataclass(frozen=True)
class SnapshotInfo:
    path: Path
    round: int
    """Outer rounds completed when the snapshot was taken."""
    step: int
    """Inner steps taken by this peer."""
    tokens: int
    """Tokens this peer has trained on."""
    time_s: float
    """Seconds since the peer started (same clock as metrics.jsonl's time_s)."""


def save_snapshot(
    directory: Path, tensors: Sequence[torch.Tensor], round: int, step: int, tokens: int, time_s: float
) -> Path:
    """Write `tensors` (e.g. φ) to directory/r{round:06d}.safetensors (temp file, then rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"r{round:06d}.safetensors"
    tmp = directory / f".{path.name}.tmp{os.getpid()}"
    meta = {"round": str(round), "step": str(step), "tokens": str(tokens), "time_s": repr(float(time_s))}
    save_file({f"t.{i}": t.detach().cpu().contiguous() for i, t in enumerate(tensors)}, str(tmp), meta)
    os.replace(tmp, path)
    return path


def list_snapshots(directory: Path) -> list[SnapshotInfo]:
    """The snapshots of one peer, by round (temp files of a write in progress are not listed)."""
    out = []
    for path in directory.glob("r*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        out.append(
            SnapshotInfo(
                path, int(meta["round"]), int(meta["step"]), int(meta["tokens"]), float(meta["time_s"])
            )
        )
    return sorted(out, key=lambda s: s.round)


def load_snapshot(path: Path) -> list[torch.Tensor]:
    tensors = load_file(str(path))
    return [tensors[f"t.{i}"] for i in range(len(tensors))]
