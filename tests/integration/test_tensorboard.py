"""`local --tensorboard-dir`: a tiny real swarm writes each peer's scalars, read back with
TensorBoard's own reader, and each peer's progress file ends at "done"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from p2p_trainer.config import to_toml
from p2p_trainer.run.progress_file import PROGRESS_FILE, read_progress
from tests.conftest import Tracker, rounds_of, tiny_config

pytestmark = pytest.mark.timeout(300)

ROUNDS = 4


def test_local_writes_tensorboard_scalars_per_peer(tmp_path: Path, tracked: Tracker) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config, run, board = tmp_path / "cfg.toml", tmp_path / "run", tmp_path / "tb"
    config.write_text(to_toml(tiny_config("diloco", rounds=ROUNDS)))
    argv = [sys.executable, "-m", "p2p_trainer", "local", "--config", str(config), "--peers", "2"]
    argv += ["--run-dir", str(run), "--no-live", "--tensorboard-dir", str(board)]
    proc = tracked(
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    assert sorted(p.name for p in board.iterdir()) == ["peer0", "peer1"]
    for i in range(2):
        acc = EventAccumulator(str(board / f"peer{i}"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        expected = {"loss/train", "loss/val", "throughput/tokens_per_s", "bytes/sent", "bytes/received"}
        assert expected | {"exchange/blocked_s", "exchange/ok", "exchange/failed"} <= tags, tags
        steps = [e.step for e in acc.Scalars("loss/train")]
        assert steps == [r.step for r in rounds_of(run, i)] and len(steps) == ROUNDS, steps
        assert steps == sorted(set(steps)) and steps[0] > 0  # one point per round, steps increasing
        assert all(e.value > 0 for e in acc.Scalars("loss/train"))
        assert sum(e.value for e in acc.Scalars("bytes/sent")) > 0  # the peers did exchange
        outcomes = sum(
            e.value for tag in ("ok", "partial", "alone", "failed") for e in acc.Scalars(f"exchange/{tag}")
        )
        assert outcomes >= ROUNDS  # every round's exchange counted under one outcome
        found = read_progress(run / f"peer{i}" / PROGRESS_FILE)
        assert found is not None and found[0] == "done", found
