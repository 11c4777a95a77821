"""Text and JSONL corpora tokenized with `data.tokenizer`, cached as memory-mapped token files.

The corpus is read and encoded in chunks of about `BATCH_CHARS` characters and the ids appended
to a file, so memory does not grow with the corpus; peers then memory-map the file and read only
the pages of the windows they draw. The cache lies in the user's cache directory
(`$P2P_TRAINER_CACHE`, default ~/.cache/p2p-trainer/tokens), not next to the corpus (which may be
read-only, like the bundled plays) nor in a run directory (every peer of a `local` run has its
own, and each would tokenize again). Its name is a hash of the data's content, the tokenizer's
and the split settings, so a changed corpus or tokenizer is tokenized again and an unchanged one
never is; files are written under temporary names and renamed, the metadata last, so a peer never
reads a half-written cache even when several tokenize at once.
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
from p2p_trainer.train.corpus_readers import (
    DataError,
    corpus_files,
    files_with,
    iter_jsonl,
    jsonl_held,
    jsonl_split_name,
    require_content,
    sniff_text,
)
from p2p_trainer.train.tokenizer import Tokenizer

BATCH_CHARS = 1 << 20
CACHE_VERSION = 1
"""Part of every cache name: a change to how text is cut or encoded here must change it."""


class TokenWriter:
    """Appends the ids of texts to one file per split, encoding them in batches."""

    def __init__(self, tokenizer: Tokenizer, files: dict[str, IO[bytes]], dtype: np.dtype) -> None:
        self.tokenizer, self.files, self.dtype = tokenizer, files, dtype
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

    def flush(self) -> None:
        for split, texts in self.pending.items():
            if texts:
                ids = np.fromiter(
                    (i for row in self.tokenizer.encode_batch(texts) for i in row), dtype=self.dtype
                )
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


def cache_name(cfg: DataConfig, fmt: str, tokenizer: Tokenizer) -> str:
    key = {
        "version": CACHE_VERSION,
        "data": data_hash(cfg),
        "tokenizer": tokenizer.sha256,
        "format": fmt,
        "val_fraction": cfg.val_fraction,
        "text_field": cfg.text_field if fmt == "jsonl" else None,
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
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
    paths = {split: root / f"{name}.{split}.bin" for split in splits}
    if not meta_path.is_file():
        try:
            root.mkdir(parents=True, exist_ok=True)
            tag = f"{os.getpid()}.{threading.get_ident()}"
            tmps = {split: p.with_name(f".{p.name}.tmp{tag}") for split, p in paths.items()}
            files: dict[str, IO[bytes]] = {split: open(tmp, "w+b") for split, tmp in tmps.items()}
        except OSError as exc:
            raise DataError(
                f"data.tokenizer={cfg.tokenizer}: cannot write the tokenized corpus under {root} ({exc}); "
                f"set {CACHE_ENV} to a writable directory with room for it"
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


def tokenized_text(
    cfg: DataConfig, files: list[Path], held: set[Path], tokenizer: Tokenizer
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Text files' ids, split as the byte reader splits them: one file's tail held out, or whole
    files, each split's files joined by a newline."""
    if len(files) == 1:

        def whole(writer: TokenWriter) -> list[str]:
            for chunk in text_chunks(files[0]):
                writer.add("all", chunk)
            return [f"{files[0].name} (tail)"]

        ids, names = cached_tokens(cfg, "text", tokenizer, ("all",), whole)
        cut = int(len(ids["all"]) * (1 - cfg.val_fraction))
        return ids["all"][:cut], ids["all"][cut:], names

    def split(writer: TokenWriter) -> list[str]:
        for path in files:
            part = "val" if path in held else "train"
            if writer.texts[part]:
                writer.add(part, "\n")
            for chunk in text_chunks(path):
                writer.add(part, chunk)
        return [p.name for p in sorted(held)]

    ids, names = cached_tokens(cfg, "text", tokenizer, ("train", "val"), split)
    return ids["train"], ids["val"], names


def tokenized_jsonl(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """JSONL lines' ids, held out as the byte reader does (`corpus_readers.read_jsonl`)."""
    files = files_with(cfg, ".jsonl")
    require_content(cfg, files)

    def one_pass(writer: TokenWriter, forced_val: str) -> tuple[float, str, str]:
        lowest = (2.0, "", "")
        for key, u, shown, text in iter_jsonl(cfg, files):
            lowest = min(lowest, (u, key, shown))
            writer.add("val" if jsonl_held(cfg, u, key, forced_val) else "train", text.decode() + "\n")
        return lowest

    def fill(writer: TokenWriter) -> list[str]:
        lowest = one_pass(writer, "")
        if writer.texts["val"] or not lowest[1]:
            return [jsonl_split_name(cfg, "")]
        writer.restart()
        one_pass(writer, lowest[1])
        return [jsonl_split_name(cfg, lowest[2])]

    ids, names = cached_tokens(cfg, "jsonl", tokenizer, ("train", "val"), fill)
    return ids["train"], ids["val"], names


def corpus_texts(cfg: DataConfig, fmt: str) -> Iterator[str]:
    """Every text of a text or JSONL corpus, both splits, streamed (to train a tokenizer on)."""
    if fmt == "jsonl":
        files = files_with(cfg, ".jsonl")
        require_content(cfg, files)
        yield from (text.decode() for _, _, _, text in iter_jsonl(cfg, files))
        return
    files = corpus_files(cfg)
    require_content(cfg, files)
    for path in files:
        sniff_text(cfg, path)
        yield from text_chunks(path)
