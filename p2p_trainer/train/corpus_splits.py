"""Each text format split into training and validation ids, through the token cache.

Whole documents are held out: a directory's files chosen by a hash of their names, JSONL lines and
table rows by a hash of where they lie (`corpus_readers.doc_held`), a DatasetDict's own validation
split where it has one; a single text file holds out its tail. One text file at byte level is
mapped as it is; everything else is written once into the token cache (token_cache.py), byte-level
ids included, so that a peer's memory does not grow with the corpus.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from p2p_trainer.config import DataConfig
from p2p_trainer.train.corpus_readers import (
    FORMAT_SUFFIX,
    DataError,
    Doc,
    corpus_files,
    doc_held,
    files_with,
    held_out_name,
    iter_jsonl,
    require_content,
    setting,
    sniff_text,
)
from p2p_trainer.train.table_readers import dataset_splits, iter_parquet, iter_split
from p2p_trainer.train.token_cache import Fill, TokenWriter, cached_tokens, text_chunks
from p2p_trainer.train.tokenizer import BYTES, Tokenizer

Splits = tuple[np.ndarray, np.ndarray, tuple[str, ...]]
"""(training ids, validation ids, names of what was held out)."""
Docs = Callable[[], Iterator[Doc]]
"""Starts a pass over a corpus's documents (holding out a document may take a second pass)."""


def held_out_files(files: list[Path], val_fraction: float) -> set[Path]:
    """Whole documents for validation, chosen by a stable hash of their names (same on every peer)."""
    n_val = max(1, math.ceil(val_fraction * len(files)))
    ranked = sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    return set(ranked[:n_val])


def tail_split(data: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """One document: hold out its tail, so validation text is still never trained on."""
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]


def _cached(cfg: DataConfig, fmt: str, tokenizer: Tokenizer, fill: Fill) -> Splits:
    ids, names = cached_tokens(cfg, fmt, tokenizer, ("train", "val"), fill)
    return ids["train"], ids["val"], names


def text_splits(cfg: DataConfig, tokenizer: Tokenizer) -> Splits:
    """Text files: one file's tail held out, or whole files, each split's files joined by a newline."""
    files = corpus_files(cfg)
    require_content(cfg, files)
    for path in files:
        sniff_text(cfg, path)
    if len(files) == 1:
        tail = (f"{files[0].name} (tail)",)
        if tokenizer.sha256 == BYTES:  # the file's bytes are its ids: map it, no copy
            return (*tail_split(np.memmap(files[0], dtype=np.uint8, mode="r"), cfg.val_fraction), tail)

        def whole(writer: TokenWriter) -> list[str]:
            writer.add_file("all", files[0])
            return list(tail)

        ids, names = cached_tokens(cfg, "text", tokenizer, ("all",), whole)
        return (*tail_split(ids["all"], cfg.val_fraction), names)
    held = held_out_files(files, cfg.val_fraction)

    def split(writer: TokenWriter) -> list[str]:
        for path in files:
            part = "val" if path in held else "train"
            if writer.texts[part]:
                writer.add(part, "\n")
            writer.add_file(part, path)
        return [p.name for p in sorted(held)]

    return _cached(cfg, "text", tokenizer, split)


def documents_fill(cfg: DataConfig, docs: Docs, unit: str) -> Fill:
    """Writes documents, each followed by a newline, held out by the hash of their keys; where that
    holds out none (a small corpus), the one with the lowest hash is, found by a second pass."""

    def one_pass(writer: TokenWriter, forced_val: str) -> tuple[float, str, str]:
        lowest = (2.0, "", "")
        for key, u, shown, text in docs():
            lowest = min(lowest, (u, key, shown))
            writer.add("val" if doc_held(cfg, u, key, forced_val) else "train", text + "\n")
        return lowest

    def fill(writer: TokenWriter) -> list[str]:
        lowest = one_pass(writer, "")
        if writer.texts["val"] or not lowest[1]:
            return [held_out_name(cfg, unit, "")]
        writer.restart()
        one_pass(writer, lowest[1])
        return [held_out_name(cfg, unit, lowest[2])]

    return fill


def _file_docs(cfg: DataConfig, fmt: str) -> Docs:
    """A JSONL or Parquet corpus's files, checked, and how to start a pass over their documents."""
    files = files_with(cfg, FORMAT_SUFFIX[fmt])
    require_content(cfg, files)
    read = iter_jsonl if fmt == "jsonl" else iter_parquet
    return lambda: read(cfg, files)


def jsonl_splits(cfg: DataConfig, tokenizer: Tokenizer) -> Splits:
    return _cached(cfg, "jsonl", tokenizer, documents_fill(cfg, _file_docs(cfg, "jsonl"), "line"))


def parquet_splits(cfg: DataConfig, tokenizer: Tokenizer) -> Splits:
    return _cached(cfg, "parquet", tokenizer, documents_fill(cfg, _file_docs(cfg, "parquet"), "row"))


def _dataset_dir(cfg: DataConfig) -> None:
    path = Path(cfg.corpus)
    if path.is_file():
        raise DataError(
            f'{setting(cfg)}: data.format = "datasets" reads a directory that `save_to_disk` wrote, not '
            'a file; point data.corpus at the directory, or set data.format = "auto"'
        )
    if not path.is_dir():
        files_with(cfg, "")  # raises the message for a missing path


def datasets_splits(cfg: DataConfig, tokenizer: Tokenizer) -> Splits:
    """A `datasets` directory: its own validation split, or rows of its training split held out.
    Opened only to write the cache: a peer that finds it written never imports `datasets`."""
    _dataset_dir(cfg)

    def fill(writer: TokenWriter) -> list[str]:
        train, val = dataset_splits(cfg)
        if val is None:
            return documents_fill(cfg, lambda: iter_split(cfg, train), "row")(writer)
        for part, split in (("train", train), ("val", val)):
            for _, _, _, text in iter_split(cfg, split):
                writer.add(part, text + "\n")
        return [f"split {val.name!r}"]

    return _cached(cfg, "datasets", tokenizer, fill)


def corpus_texts(cfg: DataConfig, fmt: str) -> Iterator[str]:
    """Every text of a text, JSONL or table corpus, all splits, streamed (to train a tokenizer on)."""
    if fmt == "text":
        files = corpus_files(cfg)
        require_content(cfg, files)
        for path in files:
            sniff_text(cfg, path)
            yield from text_chunks(path)
        return
    if fmt == "datasets":
        _dataset_dir(cfg)
        splits = [s for s in dataset_splits(cfg) if s is not None]
        docs: Iterator[Doc] = (doc for s in splits for doc in iter_split(cfg, s))
    else:
        docs = _file_docs(cfg, fmt)()
    yield from (text for _, _, _, text in docs)
