"""What a finished run's checkpoints are for: text sampled from one, and the validation loss of
each and of their average (`p2p-trainer sample` and `evaluate`).

A run directory is what `local` writes (peer*/checkpoint.safetensors, config.toml) or what `join`
writes (checkpoint.safetensors in it). The model is rebuilt from the JSON beside each checkpoint
(train/checkpoint_json.py) and holds φ, the model the swarm agreed on.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from p2p_trainer.config import DataConfig, ModelConfig, RunConfig
from p2p_trainer.run.consensus import mean_anchor
from p2p_trainer.train.checkpoint_json import read_checkpoint_json, tokenizer_entry
from p2p_trainer.train.data import check_corpus, validation_batches
from p2p_trainer.train.model import LanguageModel, build_model
from p2p_trainer.train.tokenizer import BYTES, Tokenizer, load_tokenizer

CHECKPOINT = "checkpoint.safetensors"


class RunDirError(ValueError):
    """The run directory or its checkpoints cannot be used; the message says why."""


@dataclass(frozen=True)
class PeerCheckpoint:
    name: str
    """The peer's directory name ("peer0"), or "." for a `join` run directory."""
    path: Path
    meta: dict[str, Any]
    """The JSON beside it."""

    @property
    def model_config(self) -> ModelConfig:
        return ModelConfig(**self.meta["model"])

    def anchor(self) -> list[torch.Tensor]:
        tensors = load_file(str(self.path))
        prefix = self.meta["weights"]
        return [tensors[f"{prefix}.{i}"] for i in range(len(self.meta["parameters"]))]


def _natural(path: Path) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.parent.name)]


def peer_checkpoints(run_dir: Path) -> list[PeerCheckpoint]:
    """The run directory's own checkpoint, or its peer directories' (peer2 before peer10)."""
    paths = [run_dir / CHECKPOINT] if (run_dir / CHECKPOINT).is_file() else []
    paths += sorted(run_dir.glob(f"*/{CHECKPOINT}"), key=_natural)
    if not paths:
        raise RunDirError(
            f"{run_dir}: no {CHECKPOINT} in it or in its peer directories; point at a run directory "
            "that `p2p-trainer local` or `join` wrote"
        )
    found = []
    for path in paths:
        try:
            meta = read_checkpoint_json(path)
        except ValueError as exc:
            raise RunDirError(str(exc)) from None
        found.append(PeerCheckpoint("." if path.parent == run_dir else path.parent.name, path, meta))
    return found


def model_of(
    ckpt: PeerCheckpoint, anchor: list[torch.Tensor] | None = None, device: str = "cpu"
) -> LanguageModel:
    """The checkpoint's model holding `anchor` (default: its own φ), in eval mode, on `device`."""
    model = build_model(ckpt.model_config, seed=0)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    expected = [p["name"] for p in ckpt.meta["parameters"]]
    if [n for n, _ in named] != expected:
        raise RunDirError(f"{ckpt.path}: its parameters are not those of the model its JSON describes")
    with torch.no_grad():
        for (_, p), value in zip(named, anchor if anchor is not None else ckpt.anchor(), strict=True):
            p.copy_(value)
    return model.to(device).eval()


def run_tokenizer(ckpt: PeerCheckpoint) -> Tokenizer:
    """The tokenizer the run used, checked against the sha256 the checkpoint recorded."""
    entry = ckpt.meta["tokenizer"]
    if entry["kind"] == BYTES:
        return load_tokenizer(DataConfig())
    tokenizer = load_tokenizer(DataConfig(tokenizer=entry["path"]))
    if tokenizer.sha256 != entry["sha256"]:
        raise RunDirError(
            f"{entry['path']} changed since the run (sha256 {tokenizer.sha256[:12]}, the run's "
            f"{entry['sha256'][:12]}): restore the tokenizer the run was trained with"
        )
    return tokenizer


def _pick(ckpts: list[PeerCheckpoint], peer: int | None) -> PeerCheckpoint:
    if peer is None:
        return ckpts[0]
    for ckpt in ckpts:
        if ckpt.name == f"peer{peer}":
            return ckpt
    raise RunDirError(f"no checkpoint of peer{peer}; the run has {', '.join(c.name for c in ckpts)}")


@torch.no_grad()
def sample(
    run_dir: Path,
    prompt: str,
    tokens: int,
    temperature: float,
    peer: int | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> str:
    """The prompt and `tokens` ids generated after it by one peer's model (the first peer's by
    default), decoded with the run's tokenizer. Temperature 0 is greedy; sampling draws from a
    generator seeded with `seed`, so the same call prints the same text."""
    ckpt = _pick(peer_checkpoints(run_dir), peer)
    model, tokenizer = model_of(ckpt, device=device), run_tokenizer(ckpt)
    ids = tokenizer.encode_batch([prompt or "\n"])[0]
    generator = torch.Generator(device).manual_seed(seed)
    x = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(tokens):
        logits = model(x[:, -ckpt.model_config.seq_len :])[0, -1].float()
        if temperature <= 0:
            nxt = logits.argmax().view(1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)
        x = torch.cat((x, nxt.view(1, 1)), dim=1)
    return tokenizer.decode(x[0].tolist())


@dataclass(frozen=True)
class Evaluation:
    per_peer: dict[str, float]
    """Each peer's validation loss (nats per token), by peer name."""
    average: float
    """The validation loss of the mean of the peers' φ."""
    tokens: int
    """Tokens the loss was measured on."""


def _loss(model: LanguageModel, batches: list[tuple[torch.Tensor, torch.Tensor]], device: str) -> float:
    with torch.no_grad():
        return sum(float(model(x.to(device), y.to(device))) for x, y in batches) / len(batches)


def evaluate(run_dir: Path, cfg: RunConfig, data: str | None = None, device: str = "cpu") -> Evaluation:
    """Validation loss of every peer's checkpoint and of their average, on the fixed validation
    batches of `cfg`'s data (every peer's evaluation during the run used the same) or of `data`,
    a corpus read as `cfg.data` says. The config's model and tokenizer must be the checkpoints'."""
    ckpts = peer_checkpoints(run_dir)
    if len({c.meta["run_id"] for c in ckpts}) > 1:
        raise RunDirError(f"{run_dir}: its checkpoints belong to different runs; evaluate one run at a time")
    if data is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, corpus=data))
    first = ckpts[0]
    if first.model_config != cfg.model:
        raise RunDirError(f"{first.path}: the config's [model] is not the checkpoint's; use the run's config")
    if tokenizer_entry(cfg.data).get("sha256") != first.meta["tokenizer"].get("sha256"):
        raise RunDirError(
            f"data.tokenizer={cfg.data.tokenizer} is not the tokenizer of {first.path}; use the run's config"
        )
    corpus = check_corpus(cfg)
    batches = validation_batches(corpus, cfg.model.seq_len, cfg.data.batch_size, cfg.data.val_batches)
    anchors = [c.anchor() for c in ckpts]
    per_peer = {
        c.name: _loss(model_of(c, a, device), batches, device) for c, a in zip(ckpts, anchors, strict=True)
    }
    average = _loss(model_of(first, mean_anchor(anchors), device), batches, device)
    return Evaluation(per_peer, average, sum(x.numel() for x, _ in batches))
