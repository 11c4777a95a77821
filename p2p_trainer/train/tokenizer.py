"""Tokenizers: byte-level ids (the default) or a Hugging Face `tokenizers` tokenizer.json.

`data.tokenizer` names the file ("" for bytes). Its sha256 is part of the run definition, so peers
with different tokenizers refuse each other, and `check_tokenizer` refuses a file that does not
parse or whose vocabulary is not model.vocab_size before any peer starts. `train_bpe` trains a
byte-level BPE offline (`p2p-trainer tokenizer train`): any text round-trips through it, and its
first 256 ids cover every byte, so no input is unknown. `tokenizers` is imported only here, and only
when a tokenizer file is used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from p2p_trainer.config import DataConfig, RunConfig
from p2p_trainer.train.corpus_identity import file_sha256
from p2p_trainer.train.corpus_readers import DataError

BYTES = "bytes"
"""The byte-level tokenizer's name in the run definition (where a file's sha256 goes otherwise)."""


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def sha256(self) -> str:
        """sha256 of the tokenizer file, or BYTES."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; a cut multi-byte character decodes as U+FFFD."""

    vocab_size: int = 256
    sha256: str = BYTES

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode()) for text in texts]

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class FileTokenizer:
    """A `tokenizers.Tokenizer` read from a tokenizer.json. Special tokens are never added: a
    post-processor's BOS/EOS would otherwise land in the middle of every streamed chunk."""

    def __init__(self, inner: Any, sha256: str, path: Path) -> None:
        self.inner, self.sha256, self.path = inner, sha256, path
        self.vocab_size: int = inner.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.inner.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids))


def setting(cfg: DataConfig) -> str:
    return f"data.tokenizer={cfg.tokenizer}"


def _file(cfg: DataConfig) -> Path:
    path = Path(cfg.tokenizer)
    if not path.is_file():
        raise DataError(
            f"{setting(cfg)}: no such file; point data.tokenizer at a tokenizer.json (`p2p-trainer "
            'tokenizer train` writes one), or set it to "" for byte-level tokens'
        )
    return path


def tokenizer_hash(cfg: DataConfig) -> str:
    """What the run definition holds about the tokenizer: BYTES, or the file's sha256."""
    return file_sha256(_file(cfg)) if cfg.tokenizer else BYTES


def load_tokenizer(cfg: DataConfig) -> Tokenizer:
    if not cfg.tokenizer:
        return ByteTokenizer()
    path = _file(cfg)
    from tokenizers import Tokenizer as HFTokenizer

    try:
        inner = HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for every parse error
        raise DataError(
            f"{setting(cfg)}: {path} does not parse as a Hugging Face tokenizer.json ({exc}); point "
            "data.tokenizer at the tokenizer.json a `tokenizers` tokenizer saved, or train one with "
            "`p2p-trainer tokenizer train`"
        ) from None
    return FileTokenizer(inner, file_sha256(path), path)


def check_tokenizer(cfg: RunConfig) -> Tokenizer:
    """The run's tokenizer, parsed, with a vocabulary of exactly model.vocab_size ids."""
    tokenizer = load_tokenizer(cfg.data)
    if cfg.data.tokenizer and tokenizer.vocab_size != cfg.model.vocab_size:
        raise DataError(
            f"{setting(cfg.data)} has {tokenizer.vocab_size} tokens but model.vocab_size="
            f"{cfg.model.vocab_size}: set model.vocab_size = {tokenizer.vocab_size} (one embedding "
            "row per token), or use the tokenizer the model was sized for"
        )
    return tokenizer


MIN_BPE_VOCAB = 256
"""A byte-level BPE starts from the 256 byte symbols; every merge adds one."""


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path) -> int:
    """Train a byte-level BPE of at most `vocab_size` tokens on `texts` and save it to `out`
    (atomically); returns its vocabulary size, which a small corpus can leave below the target."""
    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(f"vocab size {vocab_size}: a byte-level BPE needs at least {MIN_BPE_VOCAB}")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = HFTokenizer(models.BPE())
    # no prefix space: decode(encode(text)) is then text itself, byte for byte
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    tokenizer.save(str(tmp))
    os.replace(tmp, out)
    return int(tokenizer.get_vocab_size())
