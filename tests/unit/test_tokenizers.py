"""Tokenizers: a byte-level BPE trained offline round-trips text; text, JSONL and Parquet corpora are
tokenized with it into memory-mapped cache files and split exactly as the byte reader splits them;
a tokenizer file that does not parse, or whose vocabulary is not model.vocab_size, is refused with
a message naming the setting, before any peer starts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer as HFTokenizer

from p2p_trainer import cli
from p2p_trainer.config import DataConfig, ModelConfig, RunConfig
from p2p_trainer.run import join, local_swarm
from p2p_trainer.train import token_cache
from p2p_trainer.train.data import DataError, check_corpus, load_corpus
from p2p_trainer.train.tokenizer import load_tokenizer

SEQ = 16
VOCAB = 300
WORDS = ["the", "swarm", "peer", "gossip", "anchor", "round", "merge", "straße", "naïve", "日本語", "ωμέγα"]


def generated_text(seed: int, lines: int = 120) -> str:
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "\n" for _ in range(lines)
    )


def text_corpus(root: Path, files: int = 4) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"doc{i}.txt").write_text(generated_text(i), encoding="utf-8")
    return root


def train_tokenizer(corpus: Path, out: Path, vocab: int = VOCAB) -> Path:
    argv = ["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", str(vocab), "--out", str(out)]
    result = CliRunner().invoke(cli.main, argv)
    assert result.exit_code == 0, result.output
    assert f"vocab_size = {vocab}" in result.output
    return out


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("P2P_TRAINER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return text_corpus(tmp_path / "corpus")


@pytest.fixture
def bpe(tmp_path: Path, corpus: Path) -> Path:
    return train_tokenizer(corpus, tmp_path / "tokenizer.json")


def run_with(data: DataConfig, vocab_size: int = VOCAB) -> RunConfig:
    return RunConfig(data=data, model=ModelConfig(vocab_size=vocab_size, d_model=32, n_heads=2, seq_len=SEQ))


def test_a_trained_bpe_parses_and_round_trips_any_text(bpe: Path) -> None:
    assert HFTokenizer.from_file(str(bpe)).get_vocab_size() == VOCAB  # plain `tokenizers` reads it
    tokenizer = load_tokenizer(DataConfig(tokenizer=str(bpe)))
    assert tokenizer.vocab_size == VOCAB
    seen, unseen = generated_text(0, lines=5), "never seen: Ωmega ✓\t\ttabs,  two spaces\n\n"
    for text in (seen, unseen, ""):
        assert tokenizer.decode(tokenizer.encode_batch([text])[0]) == text
    assert len(tokenizer.encode_batch([seen])[0]) < len(seen.encode()) / 2  # it learned merges


@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet"])
def test_a_corpus_is_tokenized_once_and_split_as_the_byte_reader_splits_it(
    tmp_path: Path, corpus: Path, bpe: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    lines = generated_text(7, lines=60).splitlines()
    if kind == "jsonl":
        corpus = tmp_path / "c.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    elif kind == "parquet":
        corpus = tmp_path / "c.parquet"
        pq.write_table(pa.table({"text": lines}), corpus, row_group_size=7)
    by_bytes = load_corpus(DataConfig(corpus=str(corpus)), SEQ)
    byte_files = set((cache / "tokens").glob("*.bin"))  # byte-level ids are cached too
    tokenized = check_corpus(run_with(DataConfig(corpus=str(corpus), tokenizer=str(bpe))))
    tokenizer = load_tokenizer(DataConfig(tokenizer=str(bpe)))
    for ids, text in ((tokenized.train, by_bytes.train), (tokenized.val, by_bytes.val)):
        assert isinstance(ids, np.memmap) and ids.dtype == np.uint16
        assert tokenizer.decode(ids.tolist()) == text.tobytes().decode()
    assert tokenized.val_names == by_bytes.val_names
    assert len(set((cache / "tokens").glob("*.bin")) - byte_files) == 2

    def no_tokenizing(*args: object) -> None:
        raise AssertionError("an unchanged corpus was tokenized again")

    monkeypatch.setattr(token_cache.TokenWriter, "add", no_tokenizing)
    again = load_corpus(DataConfig(corpus=str(corpus), tokenizer=str(bpe)), SEQ)
    assert np.array_equal(again.train, tokenized.train)


def test_a_one_file_corpus_holds_out_its_tail_in_tokens(tmp_path: Path, bpe: Path) -> None:
    path = tmp_path / "one.txt"
    path.write_text(generated_text(3, lines=200), encoding="utf-8")
    corpus = load_corpus(DataConfig(corpus=str(path), tokenizer=str(bpe)), SEQ)
    tokenizer = load_tokenizer(DataConfig(tokenizer=str(bpe)))
    whole = tokenizer.decode(np.concatenate([corpus.train, corpus.val]).tolist())
    assert whole == path.read_text(encoding="utf-8")
    assert len(corpus.val) == pytest.approx(0.1 * (len(corpus.train) + len(corpus.val)), abs=1)


def test_a_vocabulary_that_is_not_the_models_names_both_settings(corpus: Path, bpe: Path) -> None:
    with pytest.raises(
        DataError,
        match=rf"data\.tokenizer={bpe} has {VOCAB} tokens but model\.vocab_size=256: "
        rf"set model\.vocab_size = {VOCAB}",
    ):
        check_corpus(run_with(DataConfig(corpus=str(corpus), tokenizer=str(bpe)), vocab_size=256))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"version": "1.0", "model": ', "does not parse as a Hugging Face tokenizer.json"),
        (bytes(range(256)), "does not parse as a Hugging Face tokenizer.json"),
        (None, "no such file"),
    ],
)
def test_a_tokenizer_file_that_does_not_parse_is_refused(
    tmp_path: Path, corpus: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=rf"data\.tokenizer={path}: .*{expected}"):
        check_corpus(run_with(DataConfig(corpus=str(corpus), tokenizer=str(path))))


class _Started(AssertionError):
    pass


def _refuse(*args: object, **kwargs: object) -> None:
    raise _Started("a process was started despite a bad tokenizer")


def _config(tmp_path: Path, corpus: Path, tokenizer: Path, vocab: int) -> str:
    path = tmp_path / "run.toml"
    path.write_text(
        f"rounds = 1\n[model]\nvocab_size = {vocab}\nd_model = 32\nn_heads = 2\nseq_len = {SEQ}\n"
        f'[data]\ncorpus = "{corpus}"\ntokenizer = "{tokenizer}"\n'
    )
    return str(path)


def test_local_and_join_refuse_a_bad_tokenizer_before_starting_anything(
    tmp_path: Path, corpus: Path, bpe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_swarm, "LocalSwarm", _refuse)
    monkeypatch.setattr(join, "join_swarm", _refuse)
    argv = ["local", "--config", _config(tmp_path, corpus, bpe, 512), "--peers", "2", "--no-live"]
    result = CliRunner().invoke(cli.main, [*argv, "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1 and not isinstance(result.exception, _Started), result.output
    assert "model.vocab_size=512: set model.vocab_size = 300" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text("not json")
    argv = ["join", "--config", _config(tmp_path, corpus, broken, VOCAB)]
    argv += ["--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/x", "--run-dir", str(tmp_path / "peer")]
    result = CliRunner().invoke(cli.main, [*argv, "--identity", str(tmp_path / "peer.key")])
    assert result.exit_code == 1 and not isinstance(result.exception, _Started), result.output
    assert f"data.tokenizer={broken}: {broken} does not parse" in result.output
