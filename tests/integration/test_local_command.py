"""`p2p-trainer local`: the README's main command, end to end, including Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from p2p_trainer.config import to_toml
from p2p_trainer.processes import group_gone
from tests.conftest import Tracker, held_sockets, remaining, rounds_of, tiny_config, wait_until

pytestmark = pytest.mark.timeout(300)


def _local(tmp: Path, rounds: int, tracked: Tracker) -> subprocess.Popen[str]:
    cfg = tmp / "cfg.toml"
    cfg.write_text(to_toml(tiny_config("factored", rounds=rounds)))
    argv = [
        sys.executable,
        "-m",
        "p2p_trainer",
        "local",
        "--config",
        str(cfg),
        "--peers",
        "3",
        "--run-dir",
        str(tmp / "run"),
        "--no-live",
    ]
    return tracked(
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    )


def test_local_run_writes_the_run_directory(tmp_path: Path, tracked: Tracker) -> None:
    proc = _local(tmp_path, rounds=40, tracked=tracked)
    assert wait_until(lambda: len(rounds_of(tmp_path / "run", 0)) >= 1, 180)
    held = held_sockets([proc.pid])
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is False and len(summary["per_peer"]) == 3
    assert all(
        p["rounds"] == 40 and p["val_loss"] < 5.4 and p["failed_exchanges"] == 0 for p in summary["per_peer"]
    )
    assert summary["averaged_model_val_loss"] is not None and summary["mean_utilisation"] > 0
    assert (run / "val_loss.png").stat().st_size > 1000
    assert "averaged model: val loss" in out
    assert group_gone(proc.pid) and held and not remaining(held)
    # nothing the run started outlives it (torch's shared-memory managers included, which leave
    # the peers' sessions): every descendant noted while it ran is gone when the command returns
    assert len(tracked.trees[proc.pid]) > 3 and not tracked.left(proc), tracked.left(proc)


def test_ctrl_c_stops_everything_and_keeps_what_was_measured(tmp_path: Path, tracked: Tracker) -> None:
    proc = _local(tmp_path, rounds=100_000, tracked=tracked)
    run = tmp_path / "run"
    assert wait_until(lambda: all(len(rounds_of(run, i)) >= 2 for i in range(3)), 180)
    held = held_sockets([proc.pid])
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]  # 128 + SIGINT, as a shell reports Ctrl-C
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert all(p["rounds"] >= 2 and p["val_loss"] is not None for p in summary["per_peer"])
    assert all((run / f"peer{i}" / "checkpoint.safetensors").exists() for i in range(3))
    assert group_gone(proc.pid) and held and not remaining(held)
    assert len(tracked.trees[proc.pid]) > 3 and not tracked.left(proc), tracked.left(proc)
