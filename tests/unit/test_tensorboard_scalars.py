"""TensorBoard scalars of a peer: what is written (read back with TensorBoard's own reader), the
setting's precedence and per-peer directories, and the error without the package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from p2p_trainer.config import RunConfig, effective_config, to_toml
from p2p_trainer.config.sections import LogConfig
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord
from p2p_trainer.run.launcher import join_argv, local_options, peer_args
from p2p_trainer.run.tensorboard_scalars import TensorBoardMissing, TensorBoardScalars, require_tensorboard

pytestmark = pytest.mark.timeout(60)

PEER = "12D3KooWpeer00000000abcdefgh"


def a_round(n: int, *exchanges: ExchangeRecord) -> RoundRecord:
    return RoundRecord(
        PEER, 1.0 + n, 1e9, n, 5 * (n + 1), 640 * (n + 1), 3.0 - 0.1 * n, 2.9 if n == 1 else None,
        0.6, 0.2, 0.8, round_tokens=640, bytes_sent=100 * (n + 1), bytes_received=90, exchanges=exchanges,
    )  # fmt: skip


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_each_round_becomes_scalars_at_its_inner_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    ok = ExchangeRecord("outer", True, 2, 0.5, 0.1)
    failed = ExchangeRecord("outer", False, 0, 1.5, 1.5, reason="timeout")
    board = TensorBoardScalars(tmp_path / "tb")
    for record in (a_round(0, ok), a_round(1, failed), a_round(2, ok)):
        board.observe(record)
    board.observe(FinalRecord(PEER, 3, 1920, 2.7, 4.0, False, step=15))
    board.close()
    got = scalars(tmp_path / "tb")
    assert {"loss/train", "loss/val", "throughput/tokens_per_s", "bytes/sent", "bytes/received"} <= set(got)
    assert {"exchange/blocked_s", "exchange/ok", "exchange/failed", "exchange/outer/seconds"} <= set(got)
    assert [s for s, _ in got["loss/train"]] == [5, 10, 15]
    assert [v for _, v in got["loss/train"]] == pytest.approx([3.0, 2.9, 2.8])
    assert got["loss/val"] == [(10, pytest.approx(2.9)), (15, pytest.approx(2.7))]  # the round's, the final
    assert [v for _, v in got["exchange/failed"]] == [0, 1, 0]
    assert [v for _, v in got["exchange/outer/seconds"]] == pytest.approx([0.5, 1.5, 0.5])
    assert [v for _, v in got["bytes/sent"]] == [100, 200, 300]
    assert [v for _, v in got["throughput/tokens_per_s"]] == pytest.approx([800.0] * 3)


def test_a_missing_tensorboard_package_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it imports
    with pytest.raises(
        TensorBoardMissing, match=r"'runs/tb' needs the tensorboard package.*p2p-trainer\[tensorboard\]"
    ):
        require_tensorboard("runs/tb")
    with pytest.raises(TensorBoardMissing):
        TensorBoardScalars(Path("runs/tb"))


def test_the_setting_follows_flag_over_environment_over_file(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(to_toml(RunConfig(log=LogConfig("from-file"))))
    assert effective_config(config).config.log.tensorboard_dir == "from-file"
    env = {"P2PT_LOG__TENSORBOARD_DIR": "from-env"}
    found = effective_config(config, environ=env)
    assert found.config.log.tensorboard_dir == "from-env" and str(found.sources["log.tensorboard_dir"]) == (
        "env P2PT_LOG__TENSORBOARD_DIR"
    )
    found = effective_config(config, environ=env, tensorboard_dir="from-flag")
    assert found.config.log.tensorboard_dir == "from-flag"
    assert str(found.sources["log.tensorboard_dir"]) == "flag --tensorboard-dir"
    # not part of the run definition: peers logging elsewhere are one swarm
    assert found.config.run_id() == RunConfig().run_id()


def test_local_gives_each_peer_its_own_directory(tmp_path: Path) -> None:
    opts = local_options(tmp_path / "run", RunConfig(log=LogConfig(str(tmp_path / "tb"))), 2)
    argvs = [join_argv(peer_args(opts, i), "--initial-peers /ip4/127.0.0.1/tcp/1/p2p/x") for i in range(2)]
    dirs = [argv[argv.index("--tensorboard-dir") + 1] for argv in argvs]
    assert dirs == [str(tmp_path / "tb" / "peer0"), str(tmp_path / "tb" / "peer1")]
    plain = local_options(tmp_path / "plain", RunConfig(), 1)
    assert "--tensorboard-dir" not in join_argv(peer_args(plain, 0), "--initial-peers x")


def test_a_directory_that_cannot_be_written_is_refused_before_anything_starts(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    import click

    from p2p_trainer.cli import _require_tensorboard

    a_file = tmp_path / "taken"
    a_file.write_text("not a directory")
    cfg = RunConfig(log=LogConfig(tensorboard_dir=str(a_file / "tb")))
    with pytest.raises(
        click.ClickException, match=r"taken/tb'.*cannot be created.*directory this user can write"
    ):
        _require_tensorboard(cfg)
    fine = RunConfig(log=LogConfig(tensorboard_dir=str(tmp_path / "new" / "tb")))
    _require_tensorboard(fine)
    assert (tmp_path / "new" / "tb").is_dir()


def test_a_failed_close_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tensorboard")
    writer = TensorBoardScalars(tmp_path / "tb")

    def broken() -> None:
        raise OSError("disk full")

    writer._writer.close = broken  # type: ignore[method-assign]
    writer.close()
    assert "closing the TensorBoard writer" in caplog.text and "disk full" in caplog.text
