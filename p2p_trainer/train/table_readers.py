"""Table corpora: Parquet files and Hugging Face `datasets` directories, one row per document.

Rows are read a record batch at a time with ordinary file reads, never a whole column: Parquet
through `pyarrow.parquet.ParquetFile.iter_batches`, a `datasets` directory by opening it with
`datasets.load_from_disk` (which checks it and names its Arrow files) and then reading those
files as Arrow streams. Reading them through load_from_disk's memory map instead would leave every
page read counted in the peer's resident memory, the whole dataset by the end of one pass.
`pyarrow` and `datasets` are imported here only, and only when such a corpus is read; the hub is
never contacted (offline mode is set before `datasets` is imported).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p_trainer.config import DataConfig
from p2p_trainer.train.corpus_readers import DataError, Doc, doc_name, setting, unit_hash

BATCH_ROWS = 1024
"""Parquet rows decoded at a time (a `datasets` file's batches are as its writer made them)."""
VAL_SPLITS = ("validation", "test")
"""A DatasetDict's splits used for validation, the first present, instead of held-out rows."""


def _field(cfg: DataConfig) -> str:
    return f"data.text_field={cfg.text_field!r}"


def check_text_column(cfg: DataConfig, where: str, names: list[str], types: dict[str, str]) -> None:
    """The table has a string column named `data.text_field`."""
    if cfg.text_field not in names:
        raise DataError(
            f"{setting(cfg)}: {where} has no column {cfg.text_field!r} ({_field(cfg)}; its columns: "
            f"{', '.join(names)}); set data.text_field to the column that holds the text"
        )
    kind = types[cfg.text_field]
    if kind not in ("string", "large_string", "string_view"):
        raise DataError(
            f"{setting(cfg)}: {where}: column {cfg.text_field!r} ({_field(cfg)}) holds {kind}, not "
            "text; set data.text_field to a string column"
        )


def _rows(cfg: DataConfig, column: Any, where: str, first: int) -> Iterator[tuple[int, str]]:
    for i, text in enumerate(column.to_pylist(), first):
        if text is None:
            raise DataError(
                f"{setting(cfg)}: {where} row {i}: column {cfg.text_field!r} ({_field(cfg)}) is null; "
                "drop or fill the empty rows"
            )
        yield i, text


def _docs(cfg: DataConfig, name: str, shown: str, rows: Iterator[tuple[int, str]]) -> Iterator[Doc]:
    for i, text in rows:
        key = f"{name}:{i}"
        yield key, unit_hash(key), f"{shown}:{i}", text


def iter_parquet(cfg: DataConfig, files: list[Path]) -> Iterator[Doc]:
    """Every row of the Parquet files as a document, keyed by (file path in the corpus, row), as a
    JSONL line is by (file path, line)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in files:
        try:
            table = pq.ParquetFile(path, memory_map=False)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{setting(cfg)}: {path} does not parse as Parquet ({exc}); convert it, or remove it "
                "from the corpus directory"
            ) from None
        schema = table.schema_arrow
        check_text_column(cfg, str(path), schema.names, {f.name: str(f.type) for f in schema})
        name = doc_name(cfg, path)

        def rows(table: Any = table, path: Path = path) -> Iterator[tuple[int, str]]:
            first = 0
            for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=[cfg.text_field]):
                yield from _rows(cfg, batch.column(0), str(path), first)
                first += batch.num_rows

        yield from _docs(cfg, name, name or path.name, rows())


def _load_from_disk(cfg: DataConfig) -> Any:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{setting(cfg)}: reading a `datasets` directory needs the `datasets` package: run "
            "`pip install 'p2p-trainer[hf]'`"
        ) from None
    datasets.disable_progress_bars()
    try:
        return datasets.load_from_disk(cfg.corpus, keep_in_memory=False)
    except Exception as exc:  # datasets raises several types for a broken directory
        raise DataError(
            f"{setting(cfg)}: does not load as a `datasets` directory ({type(exc).__name__}: {exc}); "
            "point data.corpus at what Dataset.save_to_disk or DatasetDict.save_to_disk wrote"
        ) from None


@dataclass(frozen=True)
class DatasetSplit:
    """One split of a `datasets` directory: its Arrow files, in row order."""

    name: str
    files: tuple[Path, ...]
    rows: int


def _split(cfg: DataConfig, ds: Any, name: str) -> DatasetSplit:
    if getattr(ds, "_indices", None) is not None:  # save_to_disk writes rows in order; never this
        raise DataError(f"{setting(cfg)}: split {name!r} has an indices mapping; save it with save_to_disk")
    types = {column: getattr(f, "dtype", type(f).__name__) for column, f in ds.features.items()}
    check_text_column(cfg, f"split {name!r}", list(ds.column_names), types)
    return DatasetSplit(name, tuple(Path(f["filename"]) for f in ds.cache_files), ds.num_rows)


def dataset_splits(cfg: DataConfig) -> tuple[DatasetSplit, DatasetSplit | None]:
    """The training split and, where the directory has one, its validation split: a Dataset
    directory is the training split; a DatasetDict's is "train", its "validation" or "test" the
    validation split (else rows of "train" are held out)."""
    ds = _load_from_disk(cfg)
    if not hasattr(ds, "keys"):
        return _split(cfg, ds, str(getattr(ds, "split", None) or "train")), None
    if "train" not in ds:
        raise DataError(
            f"{setting(cfg)}: the DatasetDict has no 'train' split (its splits: {', '.join(ds)}); "
            f"point data.corpus at the split to train on, {Path(cfg.corpus) / next(iter(ds), 'SPLIT')}"
        )
    val = next((s for s in VAL_SPLITS if s in ds), None)
    return _split(cfg, ds["train"], "train"), None if val is None else _split(cfg, ds[val], val)


def _stream_rows(cfg: DataConfig, split: DatasetSplit) -> Iterator[tuple[int, str]]:
    import pyarrow as pa

    first = 0
    for path in split.files:
        where = f"{path} (split {split.name!r})"
        try:
            with pa.OSFile(str(path)) as source:
                for batch in pa.ipc.open_stream(source):
                    yield from _rows(cfg, batch.column(cfg.text_field), where, first)
                    first += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{setting(cfg)}: {where} does not read as an Arrow stream ({exc}); save the dataset "
                "again with save_to_disk"
            ) from None
    if first != split.rows:
        raise DataError(
            f"{setting(cfg)}: split {split.name!r} has {first} rows in its files, its metadata says "
            f"{split.rows}; save the dataset again with save_to_disk"
        )


def iter_split(cfg: DataConfig, split: DatasetSplit) -> Iterator[Doc]:
    """Every row of the split as a document, keyed by (split, row): the same whatever the path
    the dataset lies at or how its rows are sharded into files. Streamed batch by batch."""
    return _docs(cfg, split.name, split.name, _stream_rows(cfg, split))


def dataset_files(cfg: DataConfig) -> list[Path]:
    """The files that make up a `datasets` directory, for its content hash: the JSON metadata and
    the Arrow files its state.json lists (not the cache-*.arrow files a `map` may add beside
    them). Read from the JSON, so hashing needs no `datasets` import."""
    root = Path(cfg.corpus)
    if (root / "dataset_dict.json").is_file():
        splits = _json(cfg, root / "dataset_dict.json").get("splits", [])
        dirs, files = [root / str(s) for s in splits], [root / "dataset_dict.json"]
    else:
        dirs, files = [root], []
    for d in dirs:
        state = _json(cfg, d / "state.json")
        listed = [d / str(f.get("filename", "")) for f in state.get("_data_files", [])]
        files += [p for p in (d / "dataset_info.json", d / "state.json", *listed) if p.is_file()]
    return files


def _json(cfg: DataConfig, path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{setting(cfg)}: {path} does not read as the JSON a `datasets` save_to_disk writes ({exc}); "
            "point data.corpus at such a directory, or set data.format to the corpus's format"
        ) from None
    if not isinstance(value, dict):
        raise DataError(f"{setting(cfg)}: {path} is not a JSON object; save the dataset again")
    return value
