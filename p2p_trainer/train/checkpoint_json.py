"""The JSON written next to every checkpoint: what it takes to use the weights without p2p-trainer.

checkpoint.safetensors holds tensors by index (`phi.3`: parameter 3 of the swarm's model φ); this
file names the parameters in that order, with the model's config, its norms' epsilon and the
tokenizer (its path and sha256), so safetensors, torch and json are enough to load it
(docs/checkpoints.md shows how). It holds nothing that changes within a run, so it never
disagrees with the checkpoint beside it, whichever of the two a crash left newer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from p2p_trainer.config import DataConfig, RunConfig
from p2p_trainer.train.atomic_files import atomic_write_text
from p2p_trainer.train.llama import NORM_EPS as LLAMA_NORM_EPS
from p2p_trainer.train.tokenizer import BYTES, tokenizer_hash

FORMAT = "p2p-trainer checkpoint 1"
WEIGHTS = "phi"
"""The tensors to use: φ, the model the swarm agreed on (θ, `theta.*`, is the peer's own)."""
NORM_EPS = {"gpt": 1e-5, "llama": LLAMA_NORM_EPS}
"""The GPT's LayerNorm (torch's default epsilon) and the Llama's RMSNorm."""


def json_path(checkpoint: Path) -> Path:
    return checkpoint.with_suffix(".json")


def tokenizer_entry(cfg: DataConfig) -> dict[str, str]:
    if not cfg.tokenizer:
        return {"kind": BYTES}
    return {"kind": "tokenizers", "path": str(Path(cfg.tokenizer).resolve()), "sha256": tokenizer_hash(cfg)}


def describe(cfg: RunConfig, parameters: list[tuple[str, list[int]]]) -> dict[str, Any]:
    """The JSON of a checkpoint of `cfg` whose parameters are `parameters` (name, shape), in order."""
    return {
        "format": FORMAT,
        "run_id": cfg.run_id(),
        "model": dataclasses.asdict(cfg.model),
        "norm_eps": NORM_EPS[cfg.model.arch],
        "tokenizer": tokenizer_entry(cfg.data),
        "weights": WEIGHTS,
        "parameters": [{"name": name, "shape": shape} for name, shape in parameters],
    }


def write_checkpoint_json(checkpoint: Path, cfg: RunConfig, parameters: list[tuple[str, list[int]]]) -> None:
    atomic_write_text(json_path(checkpoint), json.dumps(describe(cfg, parameters), indent=2) + "\n")


def read_checkpoint_json(checkpoint: Path) -> dict[str, Any]:
    """The JSON next to `checkpoint`; ValueError saying what is missing or wrong."""
    path = json_path(checkpoint)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: a checkpoint is used with the JSON written beside it") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a p2p-trainer checkpoint description (format {FORMAT!r})")
    return meta
