"""Data formats (text, JSONL, pre-tokenized .bin) and the checks that refuse bad data with a message
naming the setting to change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from p2p_trainer.config import DataConfig, ModelConfig, RunConfig
from p2p_trainer.train import corpus_readers
from p2p_trainer.train.data import DataError, TokenStream, check_corpus, load_corpus, validation_batches

SEQ = 16


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("P2P_TRAINER_CACHE", str(tmp_path / "cache"))  # JSONL and text dirs are cached


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": i, field: t}) + "\n" for i, t in enumerate(texts)))
    return path


def write_tokens(path: Path, ids: np.ndarray) -> Path:
    ids.tofile(path)
    return path


def run_with(data: DataConfig, vocab_size: int = 256) -> RunConfig:
    return RunConfig(data=data, model=ModelConfig(vocab_size=vocab_size, d_model=32, n_heads=2, seq_len=SEQ))


# --------------------------------------------------------------------------- JSONL


def test_jsonl_lines_are_documents_and_whole_lines_are_held_out(tmp_path: Path) -> None:
    texts = [f"document number {i} " * 5 for i in range(40)]
    cfg = DataConfig(corpus=str(write_jsonl(tmp_path / "c.jsonl", texts)), val_fraction=0.25)
    corpus = load_corpus(cfg, SEQ)
    train, val = corpus.train.tobytes().decode(), corpus.val.tobytes().decode()
    held = [t for t in texts if t in val.split("\n")]
    assert 0 < len(held) < len(texts)
    assert all(t not in train.split("\n") for t in held)  # a held-out line is never trained on
    assert sorted(train.split("\n")[:-1] + val.split("\n")[:-1]) == sorted(texts)
    again = load_corpus(cfg, SEQ)  # another peer holds out the same lines
    assert again.val.tobytes() == corpus.val.tobytes()


def test_jsonl_reads_the_configured_field_and_auto_detects_directories(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", ["alpha " * 20] * 4, field="content")
    write_jsonl(tmp_path / "b.jsonl", ["beta " * 20] * 4, field="content")
    corpus = load_corpus(DataConfig(corpus=str(tmp_path), text_field="content"), SEQ)
    everything = corpus.train.tobytes() + corpus.val.tobytes()
    assert b"alpha" in everything and b"beta" in everything and b"content" not in everything


def test_a_small_jsonl_still_holds_out_one_line(tmp_path: Path) -> None:
    texts = [f"line {i} " * 10 for i in range(3)]
    corpus = load_corpus(
        DataConfig(corpus=str(write_jsonl(tmp_path / "c.jsonl", texts)), val_fraction=0.01), SEQ
    )
    held = corpus.val.tobytes().decode().removesuffix("\n")
    assert held in texts and held not in corpus.train.tobytes().decode()
    assert corpus.val_names == (f"1 line (c.jsonl:{texts.index(held) + 1})",)


def test_a_jsonl_line_without_the_field_names_the_line_and_the_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", ["fine " * 20] * 3)
    with path.open("a") as f:
        f.write(json.dumps({"body": "no text here"}) + "\n")
    with pytest.raises(
        DataError, match=r"c\.jsonl line 4 has no field 'text' \(data\.text_field; the line holds: body\)"
    ):
        load_corpus(DataConfig(corpus=str(path)), SEQ)
    path.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(DataError, match=r"line 2: field 'text' \(data\.text_field\) is a int, not text"):
        load_corpus(DataConfig(corpus=str(path)), SEQ)
    path.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DataError, match=r"line 2 is not JSON"):
        load_corpus(DataConfig(corpus=str(path)), SEQ)


# --------------------------------------------------------------------------- token arrays


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_a_bin_file_is_memory_mapped_and_its_tail_held_out(tmp_path: Path, dtype: str) -> None:
    ids = (np.arange(5000) * 7919 % 60000).astype(dtype)
    path = write_tokens(tmp_path / "tokens.bin", ids)
    corpus = load_corpus(DataConfig(corpus=str(path), token_dtype=dtype), SEQ, vocab_size=60000)  # type: ignore[arg-type]
    assert isinstance(corpus.train, np.memmap) and isinstance(corpus.val, np.memmap)
    assert corpus.train.dtype == np.dtype(dtype)
    assert np.array_equal(np.concatenate([corpus.train, corpus.val]), ids)
    assert len(corpus.val) == 500 and corpus.val_names == ("tokens.bin (tail)",)


def test_a_nanogpt_directory_uses_its_val_bin(tmp_path: Path) -> None:
    write_tokens(tmp_path / "train.bin", np.arange(1000, dtype=np.uint16))
    write_tokens(tmp_path / "val.bin", np.arange(1000, 1100, dtype=np.uint16))
    corpus = load_corpus(DataConfig(corpus=str(tmp_path)), SEQ)
    assert len(corpus.train) == 1000 and int(corpus.val[0]) == 1000 and corpus.val_names == ("val.bin",)
    (tmp_path / "val.bin").unlink()
    with pytest.raises(DataError, match=r"val\.bin is missing"):
        load_corpus(DataConfig(corpus=str(tmp_path)), SEQ)


def test_token_streams_are_windows_of_the_file_and_deterministic_per_seed_and_peer(tmp_path: Path) -> None:
    ids = np.arange(3000, dtype=np.uint32)  # each id is its own position: windows are easy to check
    corpus = load_corpus(
        DataConfig(corpus=str(write_tokens(tmp_path / "t.bin", ids)), token_dtype="uint32"), SEQ
    )
    x, y = TokenStream(corpus.train, SEQ, 4, seed=0, peer_key="p0").batch(5)
    assert x.dtype == torch.int64 and x.shape == (4, SEQ)
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(4, SEQ - 1, dtype=torch.int64))  # contiguous
    assert torch.equal(y, x + 1)
    assert torch.equal(TokenStream(corpus.train, SEQ, 4, 0, "p0").batch(5)[0], x)
    assert not torch.equal(TokenStream(corpus.train, SEQ, 4, 0, "p1").batch(5)[0], x)
    assert not torch.equal(TokenStream(corpus.train, SEQ, 4, 1, "p0").batch(5)[0], x)


@pytest.mark.parametrize("fmt", ["jsonl", "tokens"])
def test_validation_windows_are_identical_across_peers(tmp_path: Path, fmt: str) -> None:
    if fmt == "jsonl":
        path = write_jsonl(tmp_path / "c.jsonl", [f"text {i} " * 30 for i in range(30)])
    else:
        path = write_tokens(tmp_path / "c.bin", np.arange(4000, dtype=np.uint16))
    cfg = DataConfig(corpus=str(path))
    # two peers load the corpus on their own and evaluate on the same windows
    a = validation_batches(load_corpus(cfg, SEQ), SEQ, 2, 3)
    b = validation_batches(load_corpus(cfg, SEQ), SEQ, 2, 3)
    assert len(a) == 3
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True))


# --------------------------------------------------------------------------- bad input


def test_token_ids_beyond_the_vocabulary_name_the_setting(tmp_path: Path) -> None:
    ids = np.full(2000, 5, dtype=np.uint16)
    ids[1234] = 300
    cfg = DataConfig(corpus=str(write_tokens(tmp_path / "t.bin", ids)))
    with pytest.raises(
        DataError,
        match=r"token id 300 at position 1234 of the training split is not below model\.vocab_size=256",
    ):
        check_corpus(run_with(cfg))
    assert len(check_corpus(run_with(cfg, vocab_size=301)).train) == 1800


def test_text_bytes_beyond_a_small_vocabulary_name_the_setting(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("caf\u00e9 " * 100)
    with pytest.raises(
        DataError, match=r"model\.vocab_size=128; byte-level text needs model\.vocab_size = 256"
    ):
        check_corpus(run_with(DataConfig(corpus=str(tmp_path / "t.txt")), vocab_size=128))


def test_a_bin_file_of_the_wrong_size_names_the_dtype(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x01\x00" * 501)  # 1002 bytes: uint16 ids, not uint32
    with pytest.raises(DataError, match=r"1002 bytes, not a whole number of uint32 ids.*data\.token_dtype"):
        load_corpus(DataConfig(corpus=str(path), token_dtype="uint32"), SEQ)


@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl", "empty.bin"])
def test_an_empty_corpus_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).touch()
    with pytest.raises(DataError, match=rf"data\.corpus=.*{name} is empty"):
        check_corpus(run_with(DataConfig(corpus=str(tmp_path / name))))


def test_a_directory_of_empty_files_is_refused(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"d{i}.txt").touch()
    with pytest.raises(DataError, match=r"all 3 files are empty"):
        check_corpus(run_with(DataConfig(corpus=str(tmp_path))))


def test_a_missing_corpus_is_refused(tmp_path: Path) -> None:
    for fmt in ("auto", "jsonl", "tokens"):
        with pytest.raises(DataError, match=r"data\.corpus=.*nope: no such file or directory"):
            check_corpus(run_with(DataConfig(corpus=str(tmp_path / "nope"), format=fmt)))  # type: ignore[arg-type]


def test_binary_data_is_not_accepted_as_text(tmp_path: Path) -> None:
    noise = tmp_path / "noise.txt"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    with pytest.raises(
        DataError,
        match=r"noise\.txt is binary, not text \(NUL byte at offset \d+\).*data\.format = \"tokens\"",
    ):
        check_corpus(run_with(DataConfig(corpus=str(noise))))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(("abc " * 50 + "caf\u00e9 " * 50).encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt is not UTF-8 text \(invalid byte at offset 203\)"):
        check_corpus(run_with(DataConfig(corpus=str(latin1))))
    jsonl = tmp_path / "blob.jsonl"
    jsonl.write_bytes(b'{"text": "x"}\n\x00\x01\x02')
    with pytest.raises(DataError, match=r"blob\.jsonl is binary"):
        check_corpus(run_with(DataConfig(corpus=str(jsonl))))


def test_a_character_cut_at_the_sniffed_head_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.txt"
    path.write_text("ab\u00e9" * 200)  # é is two bytes: the 3-byte head ends inside one
    monkeypatch.setattr(corpus_readers, "SNIFF_BYTES", 3)
    assert len(check_corpus(run_with(DataConfig(corpus=str(path)))).train) > 0


def test_a_corpus_too_short_for_seq_len_names_both_settings(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("x" * 60)
    with pytest.raises(
        DataError,
        match=r"validation split has 6 tokens, fewer than model\.seq_len \+ 2 = 18.*model\.seq_len or data\.val_fraction",
    ):
        check_corpus(run_with(DataConfig(corpus=str(tmp_path / "short.txt"))))


def test_the_bundled_corpus_is_text_only() -> None:
    with pytest.raises(DataError, match=r'data\.corpus=shakespeare is text: set data\.format = "text"'):
        load_corpus(DataConfig(format="tokens"), SEQ)


def test_the_reading_settings_join_the_run_definition_only_when_set(tmp_path: Path) -> None:
    base = RunConfig()
    reading = ("data_format", "data_text_field", "data_token_dtype")
    assert not any(k in base.run_definition() for k in reading)
    ids = str(write_tokens(tmp_path / "c.bin", np.arange(64, dtype=np.uint32)))
    tokens = dataclasses.replace(base, data=DataConfig(corpus=ids, format="tokens", token_dtype="uint32"))
    assert tokens.run_definition()["data_format"] == "tokens"
    assert tokens.run_definition()["data_token_dtype"] == "uint32"
    other = dataclasses.replace(tokens, data=dataclasses.replace(tokens.data, token_dtype="uint16"))
    assert other.run_id() != tokens.run_id()
