"""Corpora written once as memory-mapped token files: byte-level ids or a `data.tokenizer`'s.

Every corpus but a single text file or a .bin array (both mapped as they are) is read in chunks of
about `BATCH_CHARS` characters and its ids appended to a file per split, so memory does not grow
with the corpus; peers then memory-map the files and read only the pages of the windows they draw.
Byte-level ids are the text's bytes as they are (uint8), so a corpus reads the same whether or not
it went through the cache. How each format's texts are split is in corpus_splits.py. The cache
lies in the user's cache directory (`$P2P_TRAINER_CACHE`, default ~/.cache/p2p-trainer/tokens), not
next to the corpus (which may be read-only, like the bundled plays) nor in a run directory (every
peer of a `local` run has its own, and each would write it again). Its name is a hash of the data's
content, the tokenizer's and the split settings, so a changed corpus or tokenizer is written again
and an unchanged one never is; files are written under temporary names and renamed, the metadata
last, so a peer never reads a half-written cache even when several write it at once.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from p2p_trainer.config import DataConfig
from p2p_trainer.train.atomic_files import atomic_write_text
from p2p_trainer.train.corpus_identity import CACHE_ENV, cache_dir, data_hash
from p2p_trainer.train.corpus_readers import DataError, setting
from p2p_trainer.train.tokenizer import BYTES, Tokenizer

BATCH_CHARS = 1 << 20
CACHE_VERSION = 1
"""Part of every cache name: a change to how text is cut or encoded here must change it."""
DOCUMENT_FORMATS = ("jsonl", "parquet", "datasets")
"""Formats whose text is in a named field (`data.text_field`, part of the cache name)."""


class TokenWriter:
    """Appends the ids of texts to one file per split, encoding them in batches."""

    def __init__(self, tokenizer: Tokenizer, files: dict[str, IO[bytes]], dtype: np.dtype) -> None:
        self.tokenizer, self.files, self.dtype = tokenizer, files, dtype
        self.raw = tokenizer.sha256 == BYTES
        """Byte-level: a text's ids are its UTF-8 bytes, written without a per-byte encode."""
        self.pending: dict[str, list[str]] = {split: [] for split in files}
        self.pending_chars = 0
        self.counts = dict.fromkeys(files, 0)
        """Ids written per split."""
        self.texts = dict.fromkeys(files, 0)
        """Texts added per split."""

    def add(self, split: str, text: str) -> None:
        self.pending[split].append(text)
        self.texts[split] += 1
        self.pending_chars += len(text)
        if self.pending_chars >= BATCH_CHARS:
            self.flush()

    def add_file(self, split: str, path: Path) -> None:
        """A text file's content. Byte-level ids are its bytes as they are (invalid UTF-8
        included, as when one file is mapped directly); a tokenizer gets it decoded in chunks."""
        if not self.raw:
            for chunk in text_chunks(path):
                self.add(split, chunk)
            return
        self.flush()  # what was added before goes first
        with open(path, "rb") as f:
            while block := f.read(BATCH_CHARS):
                self.files[split].write(block)
                self.counts[split] += len(block)
                self.texts[split] += 1

    def flush(self) -> None:
        for split, texts in self.pending.items():
            if texts:
                if self.raw:
                    ids = np.frombuffer("".join(texts).encode(), dtype=np.uint8)
                else:
                    rows = self.tokenizer.encode_batch(texts)
                    ids = np.fromiter((i for row in rows for i in row), dtype=self.dtype)
                self.files[split].write(ids.tobytes())
                self.counts[split] += len(ids)
                texts.clear()
        self.pending_chars = 0

    def restart(self) -> None:
        """Drop everything written (a second pass that splits differently)."""
        for split, f in self.files.items():
            self.pending[split].clear()
            f.seek(0)
            f.truncate()
            self.counts[split] = self.texts[split] = 0
        self.pending_chars = 0


Fill = Callable[[TokenWriter], list[str]]
"""Writes the corpus's texts into the writer's splits; returns the names of the validation split."""


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:  # mmap refuses empty files; the split's length check reports it
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
    if tokenizer.sha256 == BYTES:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)


def cache_name(cfg: DataConfig, fmt: str, tokenizer: Tokenizer) -> str:
    key = {
        "version": CACHE_VERSION,
        "data": data_hash(cfg),
        "tokenizer": tokenizer.sha256,
        "format": fmt,
        "val_fraction": cfg.val_fraction,
        "text_field": cfg.text_field if fmt in DOCUMENT_FORMATS else None,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def cached_tokens(
    cfg: DataConfig, fmt: str, tokenizer: Tokenizer, splits: tuple[str, ...], fill: Fill
) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The splits' ids, memory-mapped, and the validation split's names: from the cache, or
    written by `fill` first."""
    root = cache_dir() / "tokens"
    name = cache_name(cfg, fmt, tokenizer)
    meta_path = root / f"{name}.json"
    dtype = token_dtype(tokenizer)
    paths = {split: root / f"{name}.{split}.bin" for split in splits}
    if not meta_path.is_file():
        try:
            root.mkdir(parents=True, exist_ok=True)
            tag = f"{os.getpid()}.{threading.get_ident()}"
            tmps = {split: p.with_name(f".{p.name}.tmp{tag}") for split, p in paths.items()}
            files: dict[str, IO[bytes]] = {split: open(tmp, "w+b") for split, tmp in tmps.items()}
        except OSError as exc:
            raise DataError(
                f"{setting(cfg)}: cannot write the corpus's token files under {root} ({exc}); "
                f"set {CACHE_ENV} to a writable directory with room for them"
            ) from None
        _write(files, tmps, paths, TokenWriter(tokenizer, files, dtype), fill, meta_path)
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return {split: _map(path, dtype) for split, path in paths.items()}, tuple(meta["val_names"])


def _write(
    files: dict[str, IO[bytes]],
    tmps: dict[str, Path],
    paths: dict[str, Path],
    writer: TokenWriter,
    fill: Fill,
    meta: Path,
) -> None:
    done = False
    try:
        val_names = fill(writer)
        writer.flush()
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
        done = True
    finally:
        for f in files.values():
            f.close()
        if not done:  # bad data found half-way: leave no partial file behind
            for tmp in tmps.values():
                tmp.unlink(missing_ok=True)
    for split, tmp in tmps.items():
        os.replace(tmp, paths[split])
    atomic_write_text(meta, json.dumps({"val_names": val_names, "counts": writer.counts}))


def text_chunks(path: Path) -> Iterator[str]:
    """The file's text in pieces of about BATCH_CHARS, cut after a newline where the piece has one
    (a piece then ends where a pre-tokenizer splits anyway); invalid UTF-8 becomes U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""
    with open(path, "rb") as f:
        while block := f.read(BATCH_CHARS):
            text = carry + decoder.decode(block)
            cut = text.rfind("\n") + 1 or len(text)
            carry = text[cut:]
            yield text[:cut]
    if rest := carry + decoder.decode(b"", final=True):
        yield rest
