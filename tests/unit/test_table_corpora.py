"""Table corpora (Parquet files, `datasets` directories): each row a document, whole rows held out
the same way on every read, read a batch at a time, and bad tables refused with a message naming
the setting to change. Also: every byte-level format but one text file goes through the memory-
mapped token cache."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from p2p_trainer.config import DataConfig, ModelConfig, RunConfig
from p2p_trainer.train import corpus_splits, table_readers
from p2p_trainer.train.corpus_identity import data_hash
from p2p_trainer.train.corpus_readers import resolve_format
from p2p_trainer.train.corpus_splits import corpus_texts
from p2p_trainer.train.data import DataError, check_corpus, load_corpus
from p2p_trainer.train.token_reads import file_region, read_span, read_windows

SEQ = 16


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("P2P_TRAINER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def texts(n: int, tag: str = "doc") -> list[str]:
    return [f"{tag} {i}: " + "words of the row " * (i % 5 + 1) for i in range(n)]


def write_parquet(path: Path, rows: list[str], field: str = "text", row_group: int = 16) -> Path:
    table = pa.table({"id": list(range(len(rows))), field: rows})
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_dataset(path: Path, splits: dict[str, list[str]], field: str = "text") -> Path:
    made = {name: datasets.Dataset.from_dict({field: rows}) for name, rows in splits.items()}
    if list(made) == [""]:
        made[""].save_to_disk(str(path))
    else:
        datasets.DatasetDict(made).save_to_disk(str(path))
    return path


def lines(ids: np.ndarray) -> list[str]:
    return ids.tobytes().decode().split("\n")[:-1]


def run_with(data: DataConfig) -> RunConfig:
    return RunConfig(data=data, model=ModelConfig(vocab_size=256, d_model=32, n_heads=2, seq_len=SEQ))


# --------------------------------------------------------------------------- Parquet


def test_parquet_rows_are_documents_held_out_the_same_on_every_read(tmp_path: Path) -> None:
    rows = texts(200)
    write_parquet(tmp_path / "a.parquet", rows[:120])
    (tmp_path / "sub").mkdir()
    write_parquet(tmp_path / "sub" / "b.parquet", rows[120:])
    cfg = DataConfig(corpus=str(tmp_path), val_fraction=0.2)
    assert resolve_format(cfg) == "parquet"
    corpus = check_corpus(run_with(cfg))
    train, val = lines(corpus.train), lines(corpus.val)
    assert sorted(train + val) == sorted(rows)  # every row whole, in one split only
    assert 10 < len(val) < 70 and not set(train) & set(val)
    assert corpus.val_names == ("rows hashed below 0.2",)
    assert isinstance(corpus.train, np.memmap) and corpus.train.dtype == np.uint8
    again = load_corpus(cfg, SEQ)  # another peer holds out the same rows
    assert again.val.tobytes() == corpus.val.tobytes() and again.train.tobytes() == corpus.train.tobytes()


def test_a_small_parquet_still_holds_out_one_row(tmp_path: Path) -> None:
    rows = texts(3)
    corpus = load_corpus(
        DataConfig(corpus=str(write_parquet(tmp_path / "c.parquet", rows)), val_fraction=0.01), SEQ
    )
    (held,) = lines(corpus.val)
    assert held in rows and held not in lines(corpus.train)
    assert corpus.val_names == (f"1 row (c.parquet:{rows.index(held)})",)


def rows_per_batch(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every column batch the readers decode, in order, as they decode them."""
    seen: list[int] = []
    real = table_readers._rows

    def spy(cfg: DataConfig, column: Any, where: str, first: int) -> Iterator[tuple[int, str]]:
        seen.append(len(column))
        return real(cfg, column, where, first)

    monkeypatch.setattr(table_readers, "_rows", spy)
    return seen


def test_parquet_is_read_a_batch_of_rows_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = texts(100)
    path = write_parquet(tmp_path / "c.parquet", rows, row_group=30)
    seen = rows_per_batch(monkeypatch)
    monkeypatch.setattr(table_readers, "BATCH_ROWS", 8)
    docs = table_readers.iter_parquet(DataConfig(corpus=str(path)), [path])
    assert next(docs)[3] == rows[0] and seen == [8]  # the first row comes before the rest is read
    assert [d[3] for d in docs] == rows[1:]
    assert max(seen) <= 8 and sum(seen) == 100


def test_bad_parquet_names_the_setting(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "c.parquet", texts(40), field="body")
    with pytest.raises(
        DataError,
        match=r"c\.parquet has no column 'text' \(data\.text_field='text'; its columns: id, body\); "
        r"set data\.text_field",
    ):
        check_corpus(run_with(DataConfig(corpus=str(path))))
    with pytest.raises(DataError, match=r"column 'id' \(data\.text_field='id'\) holds int64, not text"):
        load_corpus(DataConfig(corpus=str(path), text_field="id"), SEQ)
    pq.write_table(pa.table({"text": ["fine " * 20, None]}), path)
    with pytest.raises(
        DataError, match=r"c\.parquet row 1: column 'text' \(data\.text_field='text'\) is null"
    ):
        load_corpus(DataConfig(corpus=str(path)), SEQ)
    path.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(DataError, match=r"data\.corpus=.*c\.parquet does not parse as Parquet"):
        load_corpus(DataConfig(corpus=str(path)), SEQ)


# --------------------------------------------------------------------------- datasets


def test_a_saved_dataset_holds_out_rows_by_hash(tmp_path: Path) -> None:
    rows = texts(300)
    cfg = DataConfig(corpus=str(write_dataset(tmp_path / "ds", {"": rows})))
    assert resolve_format(cfg) == "datasets"
    corpus = check_corpus(run_with(cfg))
    train, val = lines(corpus.train), lines(corpus.val)
    assert sorted(train + val) == sorted(rows) and not set(train) & set(val)
    assert 10 < len(val) < 60 and corpus.val_names == ("rows hashed below 0.1",)
    assert isinstance(corpus.val, np.memmap)
    moved = tmp_path / "elsewhere"
    (tmp_path / "ds").rename(moved)  # the same dataset at another path: the same split
    assert load_corpus(DataConfig(corpus=str(moved)), SEQ).val.tobytes() == corpus.val.tobytes()


@pytest.mark.parametrize("val_split", ["validation", "test"])
def test_a_dataset_dicts_own_validation_split_is_used(tmp_path: Path, val_split: str) -> None:
    train, held = texts(80, "train"), texts(20, "held")
    path = write_dataset(tmp_path / "dd", {"train": train, val_split: held, "extra": texts(5, "x")})
    corpus = load_corpus(DataConfig(corpus=str(path)), SEQ)
    assert lines(corpus.train) == train and lines(corpus.val) == held
    assert corpus.val_names == (f"split {val_split!r}",)
    one = load_corpus(DataConfig(corpus=str(path / "extra"), val_fraction=0.3), SEQ)  # a split alone
    assert sorted(lines(one.train) + lines(one.val)) == sorted(texts(5, "x"))


def test_dataset_batches_are_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_dataset(tmp_path / "ds", {"": texts(2500)})
    seen = rows_per_batch(monkeypatch)
    load_corpus(DataConfig(corpus=str(path)), SEQ)
    assert len(seen) >= 3 and max(seen) <= 1000 and sum(seen) == 2500  # save_to_disk's batches


def test_bad_datasets_directories_name_the_setting(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "dd", {"validation": texts(30), "other": texts(30)})
    with pytest.raises(
        DataError,
        match=r"data\.corpus=.*dd: the DatasetDict has no 'train' split \(its splits: validation, other\); point data\.corpus at the split",
    ):
        check_corpus(run_with(DataConfig(corpus=str(path))))
    path = write_dataset(tmp_path / "body", {"": texts(30)}, field="body")
    with pytest.raises(
        DataError, match=r"split 'train' has no column 'text' \(data\.text_field='text'; its columns: body\)"
    ):
        load_corpus(DataConfig(corpus=str(path)), SEQ)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "state.json").write_text("{}")
    with pytest.raises(DataError, match=r"plain: does not load as a `datasets` directory"):
        load_corpus(DataConfig(corpus=str(tmp_path / "plain"), format="datasets"), SEQ)
    with pytest.raises(DataError, match=r'data\.format = "datasets" reads a directory'):
        load_corpus(DataConfig(corpus=str(path / "state.json"), format="datasets"), SEQ)


def test_a_datasets_hash_is_its_content_not_cache_files_beside_it(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "ds", {"": texts(50)})
    cfg = DataConfig(corpus=str(path))
    before = data_hash(cfg)
    (path / "cache-0123.arrow").write_bytes(b"what a map() leaves")
    assert data_hash(cfg) == before
    other = write_dataset(tmp_path / "ds2", {"": texts(51)})
    assert data_hash(DataConfig(corpus=str(other))) != before


def test_tokenizer_training_reads_table_texts(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "c.parquet", texts(10))
    assert list(corpus_texts(DataConfig(corpus=str(path)), "parquet")) == texts(10)
    dd = write_dataset(tmp_path / "dd", {"train": texts(4), "test": texts(2, "t")})
    assert list(corpus_texts(DataConfig(corpus=str(dd)), "datasets")) == texts(4) + texts(2, "t")


# --------------------------------------------------------------------------- streaming


def test_a_written_corpus_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path / "c.parquet", texts(60))
    first = load_corpus(DataConfig(corpus=str(path)), SEQ)

    def no_reading(*args: object) -> None:
        raise AssertionError("an unchanged corpus was read again")

    monkeypatch.setattr(corpus_splits, "iter_parquet", no_reading)
    assert load_corpus(DataConfig(corpus=str(path)), SEQ).train.tobytes() == first.train.tobytes()


def test_byte_level_text_and_jsonl_are_mapped_not_held_in_memory(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"d{i}.txt").write_text(f"file {i} " * 50)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40)))
    for corpus in (str(tmp_path), str(tmp_path / "c.jsonl"), str(tmp_path / "d0.txt")):
        read = load_corpus(DataConfig(corpus=corpus, val_fraction=0.3), SEQ)
        assert isinstance(read.train, np.memmap) and isinstance(read.val, np.memmap), corpus


def test_windows_and_checks_read_the_file_not_the_map(tmp_path: Path) -> None:
    ids = (np.arange(300_000) % 50_000).astype(np.uint16)
    (tmp_path / "t.bin").write_bytes(b"head" + ids.tobytes())  # a map that starts at an offset
    mapped = np.memmap(tmp_path / "t.bin", dtype=np.uint16, mode="r", offset=4)
    part = mapped[12_345:250_001]
    assert file_region(part) == (str(tmp_path / "t.bin"), 4 + 2 * 12_345)
    starts = np.array([0, 7, 99_999, len(part) - 33])
    windows = read_windows(part, starts, 33)
    assert not isinstance(windows, np.memmap)
    assert np.array_equal(windows, ids[12_345:250_001][starts[:, None] + np.arange(33)])
    assert np.array_equal(read_span(part, 1000, 5000), ids[13_345:17_345])
    assert file_region(ids) is None and np.array_equal(read_windows(ids, starts, 33)[1], ids[7:40])
