"""Content hashes of the corpus: what the run definition compares between peers about the data.

Data is identified by what its files hold, not where they lie: the same files at two paths give
one hash, different files at one path give two. The names of a directory's files count (they
choose the held-out documents), a one-file corpus's name does not. Each file's sha256 is read in
chunks and cached by (path, size, mtime), in memory and under the cache directory, so restarts
and the peer processes of one `local` run do not read a large corpus again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from p2p_trainer.config import DataConfig
from p2p_trainer.train.atomic_files import atomic_write_text
from p2p_trainer.train.corpus_readers import (
    FORMAT_SUFFIX,
    NANOGPT_SPLITS,
    corpus_files,
    files_with,
    resolve_format,
    shakespeare_files,
)
from p2p_trainer.train.table_readers import dataset_files

CACHE_ENV = "P2P_TRAINER_CACHE"
"""Overrides the cache directory (file hashes, tokenized corpora); default ~/.cache/p2p-trainer."""
CHUNK = 1 << 22
RACY_NS = 2_000_000_000
"""A cached hash counts only for a file last modified this long before it was hashed: timestamps
are coarse (a clock tick), so a file rewritten with as many bytes right after it was hashed can
keep its mtime, and only a file that had been left alone for a while is known to be unchanged."""

_memo: dict[str, dict[str, int | str]] = {}


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "p2p-trainer"


def _fresh(entry: dict[str, int | str] | None, st: os.stat_result) -> str | None:
    if entry is None or (entry.get("size"), entry.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return None
    hashed_at = entry.get("hashed_at_ns")
    if not isinstance(hashed_at, int) or st.st_mtime_ns > hashed_at - RACY_NS:
        return None
    digest = entry.get("sha256")
    return digest if isinstance(digest, str) else None


def _read_entry(path: Path) -> dict[str, int | str] | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def file_sha256(path: Path) -> str:
    """sha256 of the file's bytes, read in chunks; cached by (path, size, mtime)."""
    real = str(path.resolve())
    st = os.stat(real)
    stored = cache_dir() / "hashes" / f"{hashlib.sha256(real.encode()).hexdigest()[:32]}.json"
    for known in (_memo.get(real), _read_entry(stored)):
        digest = _fresh(known, st)
        if digest is not None:
            return digest
    hashed_at = time.time_ns()  # before the read: a write during it makes the entry count as racy
    h = hashlib.sha256()
    with open(real, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    entry: dict[str, int | str] = {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "hashed_at_ns": hashed_at,
        "sha256": h.hexdigest(),
    }
    _memo[real] = entry
    with contextlib.suppress(OSError):  # a read-only cache costs a re-read, nothing else
        atomic_write_text(stored, json.dumps(entry))
    return h.hexdigest()


def data_files(cfg: DataConfig) -> list[tuple[str, Path]]:
    """(name in the corpus, path) of every file `cfg` reads, in reading order."""
    fmt, root = resolve_format(cfg), Path(cfg.corpus)
    if cfg.corpus == "shakespeare":
        return [(p.name, p) for p in shakespeare_files()]
    if fmt == "tokens" and root.is_dir():
        files = [root / name for name in NANOGPT_SPLITS if (root / name).is_file()]
    elif fmt == "text":
        files = corpus_files(cfg)
    elif fmt == "datasets" and root.is_dir():
        files = dataset_files(cfg)
    else:
        files = files_with(cfg, FORMAT_SUFFIX.get(fmt, ".bin"))
    return [(p.relative_to(root).as_posix() if root.is_dir() else "", p) for p in files]


def data_hash(cfg: DataConfig) -> str:
    """sha256 over the names, sizes and sha256s of the corpus's files."""
    h = hashlib.sha256(b"p2p-trainer corpus\n")
    for name, path in data_files(cfg):
        h.update(f"{name}\0{path.stat().st_size}\0{file_sha256(path)}\n".encode())
    return h.hexdigest()
