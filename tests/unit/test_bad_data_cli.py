"""`local` and `join` refuse bad data with a message and a non-zero exit before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from p2p_trainer import cli
from p2p_trainer.run import join, local_swarm


def _config(tmp_path: Path, corpus: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        f'rounds = 1\n[model]\nd_model = 32\nn_heads = 2\nseq_len = 16\n[data]\ncorpus = "{corpus}"\n'
    )
    return path


class _Started(AssertionError):
    pass


def _refuse(*args: object, **kwargs: object) -> None:
    raise _Started("a process was started despite bad data")


def test_local_with_an_empty_corpus_exits_non_zero_before_starting_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty.txt"
    empty.touch()
    monkeypatch.setattr(local_swarm, "LocalSwarm", _refuse)
    run_dir = tmp_path / "run"
    argv = [
        "local",
        "--config",
        str(_config(tmp_path, empty)),
        "--peers",
        "2",
        "--no-live",
        "--run-dir",
        str(run_dir),
    ]
    result = CliRunner().invoke(cli.main, argv)
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, _Started)
    assert f"data.corpus={empty}: {empty} is empty" in result.output
    assert not list(run_dir.glob("peer*")) and not (run_dir / "summary.json").exists()


def test_join_with_binary_data_exits_non_zero_before_its_node_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes(range(256)) * 8)
    monkeypatch.setattr(join, "join_swarm", _refuse)
    argv = [
        "join",
        "--config",
        str(_config(tmp_path, noise)),
        "--initial-peers",
        "/ip4/127.0.0.1/tcp/1/p2p/x",
    ]
    argv += ["--run-dir", str(tmp_path / "peer"), "--identity", str(tmp_path / "peer.key")]
    result = CliRunner().invoke(cli.main, argv)
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, _Started)
    assert "noise.txt is binary, not text" in result.output


def test_join_with_cuda_on_a_machine_without_it_says_what_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(join, "run_peer", _refuse)
    argv = ["join", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/x", "--device", "cuda:0"]
    result = CliRunner().invoke(cli.main, [*argv, "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "--device cuda:0: no CUDA device is visible" in result.output and "--device cpu" in result.output
