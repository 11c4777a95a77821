"""The run definition identifies the data and the tokenizer by content: the same bytes at two paths
are one run, other bytes at one path another, and a refused joiner is told which hash differs."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from bench.fuzz.fakes import DictDHT
from p2p_trainer.config import DataConfig, RunConfig
from p2p_trainer.net import records
from p2p_trainer.net.records import RunDefinition, RunDefinitionMismatch
from p2p_trainer.train import corpus_identity
from tests.unit.test_record_bounds import SIGNERS
from tests.unit.test_tokenizers import generated_text, text_corpus, train_tokenizer


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("P2P_TRAINER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus_identity, "_memo", {})
    return tmp_path / "cache"


def run_on(corpus: Path, tokenizer: Path | None = None) -> RunConfig:
    return RunConfig(data=DataConfig(corpus=str(corpus), tokenizer=str(tokenizer or "")))


def test_the_same_bytes_at_two_paths_are_one_run(tmp_path: Path) -> None:
    text = generated_text(1)
    a, b = tmp_path / "a" / "plays.txt", tmp_path / "elsewhere" / "copy.txt"
    for path in (a, b):
        path.parent.mkdir()
        path.write_text(text, encoding="utf-8")
    assert run_on(a).run_id() == run_on(b).run_id()
    assert str(tmp_path) not in json.dumps(run_on(a).run_definition())  # no path in the definition
    assert run_on(text_corpus(tmp_path / "d1")).run_id() == run_on(text_corpus(tmp_path / "d2")).run_id()


def test_other_bytes_at_one_path_are_another_run(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("a" * 4096)
    before = run_on(path).run_id()
    stamp = path.stat()
    path.write_text("b" * 4096)  # as many bytes, and the same mtime: a coarse clock can give that
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert run_on(path).run_id() != before


def test_a_renamed_file_of_a_directory_is_another_run(tmp_path: Path) -> None:
    corpus = text_corpus(tmp_path / "corpus")
    before = run_on(corpus).run_id()
    (corpus / "doc0.txt").rename(corpus / "zzz.txt")  # the names choose the held-out documents
    assert run_on(corpus).run_id() != before


def test_a_settled_file_is_hashed_once(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(generated_text(2))
    hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))
    digest = corpus_identity.file_sha256(path)
    assert list((cache / "hashes").glob("*.json"))
    monkeypatch.setattr(corpus_identity, "_memo", {})  # a new process: only the cache on disk

    def no_reading(*args: object) -> None:
        raise AssertionError("the file was read again")

    monkeypatch.setattr(corpus_identity, "open", no_reading, raising=False)
    assert corpus_identity.file_sha256(path) == digest


def test_the_tokenizer_is_part_of_the_run_by_content(tmp_path: Path) -> None:
    corpus = text_corpus(tmp_path / "corpus")
    bytes_run = run_on(corpus)
    assert bytes_run.run_definition()["tokenizer_hash"] == "bytes"
    small = train_tokenizer(corpus, tmp_path / "small.json", vocab=280)
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(small.read_bytes())
    large = train_tokenizer(corpus, tmp_path / "large.json", vocab=320)
    ids = {run_on(corpus, t).run_id() for t in (small, copy)}
    assert len(ids) == 1 and bytes_run.run_id() not in ids and run_on(corpus, large).run_id() not in ids


def _refusal(ours: RunConfig, swarm: RunConfig) -> str:
    dht = DictDHT()
    records.check_run_definition(
        dht, "run", RunDefinition(swarm.run_definition()), 30, SIGNERS[0], verify=False
    )
    with pytest.raises(RunDefinitionMismatch) as raised:
        records.check_run_definition(
            dht, "run", RunDefinition(ours.run_definition()), 30, SIGNERS[1], verify=False
        )
    return str(raised.value)


def test_a_refused_joiner_is_told_which_hash_differs(tmp_path: Path) -> None:
    corpus = text_corpus(tmp_path / "corpus")
    other = tmp_path / "other.txt"
    other.write_text(generated_text(9))
    swarm = run_on(corpus)
    message = _refusal(run_on(other), swarm)
    assert "differs from ours in 1 field(s): data_hash: ours=" in message
    assert "(the data differs: data.corpus holds other files or other content)" in message
    tokenizer = train_tokenizer(corpus, tmp_path / "t.json", vocab=256)
    with_tokenizer = dataclasses.replace(
        swarm, data=dataclasses.replace(swarm.data, tokenizer=str(tokenizer))
    )
    message = _refusal(with_tokenizer, swarm)
    assert (
        "1 field(s): tokenizer_hash: ours=" in message and "swarm's='bytes' (the tokenizer differs" in message
    )
