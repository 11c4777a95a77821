"""Checkpoints: model, inner optimizer, anchor, outer momentum, round, data position, RNG.

Tensors go into one safetensors file, everything else into its JSON metadata; the file is
written to a temporary name and renamed, so a crash never leaves a half-written checkpoint. A JSON
beside it describes the model for use without p2p-trainer (checkpoint_json.py).
Only local files written by this program are read back (never anything from the network).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from p2p_trainer.train.atomic_files import atomic_write_text as atomic_write_text  # re-exported
from p2p_trainer.train.checkpoint_json import write_checkpoint_json
from p2p_trainer.train.trainer import Peer


def _tensors(peer: Peer) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for i, p in enumerate(peer.params):
        out[f"theta.{i}"] = p.detach().cpu().contiguous()
        out[f"phi.{i}"] = peer.state.anchor[i].detach().cpu().contiguous()
        out[f"m.{i}"] = peer.state.momentum[i].detach().cpu().contiguous()
        opt = peer.optimizer.state.get(p, {})
        for name in ("exp_avg", "exp_avg_sq"):
            if name in opt:
                out[f"adam.{name}.{i}"] = opt[name].detach().cpu().contiguous()
    return out


def state_hash(peer: Peer) -> str:
    """sha256 over every checkpointed tensor and counter: equal at save and after load."""
    h = hashlib.sha256()
    for name, t in sorted(_tensors(peer).items()):
        h.update(name.encode())
        h.update(t.float().numpy().tobytes())
    h.update(f"{peer.state.round}/{peer.step}/{peer.tokens}/{peer.stream.position}".encode())
    return h.hexdigest()


def save_checkpoint(peer: Peer, path: str | Path) -> str:
    """Write the checkpoint atomically; returns its state hash."""
    path = Path(path)
    adam_steps = [float(peer.optimizer.state.get(p, {}).get("step", 0)) for p in peer.params]
    meta: dict[str, Any] = {
        "round": peer.state.round,
        "step": peer.step,
        "skip_steps": peer.skip_steps,  # a peer stopped mid-round resumes it there
        "work_done": peer.work_done,  # ... with the part of its work quota it has done
        "tokens": peer.tokens,
        "tokens_since_merge": peer.tokens_since_merge,
        "anchor_tokens": peer.anchor_tokens,  # the next round's Mix1 weight
        "data_position": peer.stream.position,
        "adam_steps": adam_steps,
        "scheduler": peer.scheduler.state_dict(),
        "lrs": [g["lr"] for g in peer.optimizer.param_groups],
        "torch_rng": peer_rng_state(),
        "run_id": peer.cfg.run_id(),
        "state_hash": state_hash(peer),
    }
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(_tensors(peer), str(tmp), metadata={"p2p_trainer": json.dumps(meta)})
    os.replace(tmp, path)
    names = [(n, list(p.shape)) for n, p in peer.model.named_parameters() if p.requires_grad]
    write_checkpoint_json(path, peer.cfg, names)
    return str(meta["state_hash"])


def peer_rng_state() -> dict[str, Any]:
    return {
        "torch": torch.random.get_rng_state().tolist(),
        "python": repr(random.getstate()),
        "numpy_seed_note": "data order is derived from (seed, peer, batch index), not global RNG",
    }


class CheckpointError(ValueError):
    """A checkpoint that does not fit this run; the message says why."""


def load_checkpoint(peer: Peer, path: str | Path) -> str:
    """Restore `peer` from `path`; returns the state hash (checked against the one saved)."""
    path = Path(path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("p2p_trainer", "{}"))
    if meta.get("run_id") != peer.cfg.run_id():
        raise CheckpointError(
            f"{path} belongs to run {meta.get('run_id')}, not {peer.cfg.run_id()}: use a matching config"
        )
    tensors = load_file(str(path))
    with torch.no_grad():
        for i, p in enumerate(peer.params):
            p.copy_(tensors[f"theta.{i}"])
            if f"adam.exp_avg.{i}" in tensors:
                peer.optimizer.state[p] = {
                    "step": torch.tensor(meta["adam_steps"][i]),
                    "exp_avg": tensors[f"adam.exp_avg.{i}"].to(p.device),
                    "exp_avg_sq": tensors[f"adam.exp_avg_sq.{i}"].to(p.device),
                }
    n = len(peer.params)
    where = peer.mirror.state_device  # the host, with offload
    peer.state.anchor = [tensors[f"phi.{i}"].to(where) for i in range(n)]
    peer.state.momentum = [tensors[f"m.{i}"].to(where) for i in range(n)]
    peer.state.round, peer.step, peer.tokens = meta["round"], meta["step"], meta["tokens"]
    peer.skip_steps, peer.work_done = meta.get("skip_steps", 0), meta.get("work_done", 0)
    peer.tokens_since_merge, peer.stream.position = meta["tokens_since_merge"], meta["data_position"]
    peer.anchor_tokens = meta.get("anchor_tokens", 0)
    peer.scheduler.load_state_dict(meta["scheduler"])
    for group, lr in zip(peer.optimizer.param_groups, meta["lrs"], strict=True):
        group["lr"] = lr  # the scheduler's state does not carry the lr it last set
    torch.random.set_rng_state(torch.tensor(meta["torch_rng"]["torch"], dtype=torch.uint8))
    loaded = state_hash(peer)
    if loaded != meta["state_hash"]:
        raise CheckpointError(
            f"{path}: state hash after load {loaded[:12]} != saved {meta['state_hash'][:12]}"
        )
    return loaded


def read_anchor(path: str | Path) -> list[torch.Tensor]:
    """Just φ from a checkpoint (for evaluating the swarm's averaged model)."""
    tensors = load_file(str(path))
    n = sum(1 for k in tensors if k.startswith("phi."))
    return [tensors[f"phi.{i}"] for i in range(n)]
