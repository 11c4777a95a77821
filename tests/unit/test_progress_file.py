"""`local`'s live table: each peer's state, from the files a peer writes (progress.json,
metrics.jsonl) and its exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, StartRecord
from p2p_trainer.run.launcher import LocalSwarm, local_options
from p2p_trainer.run.local_swarm import peer_rows, render
from p2p_trainer.run.progress_file import PROGRESS_FILE, Progress, ProgressFile, peer_state, read_progress
from p2p_trainer.train.metrics import MetricsWriter
from tests.conftest import tiny_config, wait_until

pytestmark = pytest.mark.timeout(30)

PEER = "12D3KooWpeer00000000abcdefgh"


def a_round(n: int) -> RoundRecord:
    ok = ExchangeRecord("outer", True, 2, 0.5, 0.1, bytes_sent=100, bytes_received=120)
    return RoundRecord(
        PEER, 1.0 + n, 1e9, n, 5 * (n + 1), 640 * (n + 1), 3.0, None, 0.6, 0.2, 0.8, exchanges=(ok,)
    )


def write_metrics(peer_dir: Path, *records: StartRecord | RoundRecord | FinalRecord) -> None:
    writer = MetricsWriter(peer_dir / "metrics.jsonl")
    for record in records:
        writer.write(record)
    writer.close()


def final(stopped: bool) -> FinalRecord:
    return FinalRecord(PEER, 2, 1280, 2.9, 3.0, stopped, step=10)


def test_phases_and_progress_are_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "peer0" / PROGRESS_FILE
    progress = ProgressFile(path, period_s=0.05)
    progress.phase("starting")
    assert read_progress(path) == ("starting", Progress())
    current = [Progress(3, 2, 5, 17)]
    progress.follow(lambda: current[0])
    progress.phase("training")
    assert read_progress(path) == ("training", Progress(3, 2, 5, 17))
    current[0] = Progress(3, 4, 5, 19)  # the thread writes progress without a phase change
    assert wait_until(lambda: read_progress(path) == ("training", Progress(3, 4, 5, 19)), 5, 0.02)
    progress.close()
    assert not list(path.parent.glob(".*tmp*"))  # no temporary file left beside it
    with pytest.raises(ValueError, match="phase 'napping'"):
        progress.phase("napping")


def test_a_missing_or_malformed_progress_file_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    assert read_progress(path) is None
    for text in (
        "{not json",
        json.dumps({"phase": "flying", "round": 0, "round_step": 0, "round_steps": 0, "step": 0}),
    ):
        path.write_text(text)
        assert read_progress(path) is None
    path.write_text(
        json.dumps({"phase": "training", "round": "x", "round_step": 0, "round_steps": 5, "step": 0})
    )
    assert read_progress(path) is None


def test_the_table_shows_each_peer_state_from_its_files(tmp_path: Path) -> None:
    """Peers 0-8, each in one state: a fresh process, one in each phase it writes, and three exits."""
    start = StartRecord(PEER, 1e9, "run", "diloco")
    phases = {
        1: ("starting", Progress()),
        2: ("waiting-for-peers", Progress()),
        3: ("training", Progress(2, 3, 5, 13)),
        4: ("training", Progress(2, 5, 5, 15)),
        5: ("stopping", Progress(3, 0, 5, 15)),
    }
    for i, (phase, progress) in phases.items():
        board = ProgressFile(tmp_path / f"peer{i}" / PROGRESS_FILE)
        board.follow(lambda p=progress: p)  # type: ignore[misc]
        board.phase(phase)
        board.close()
    for i in (3, 4, 5):
        write_metrics(tmp_path / f"peer{i}", start, a_round(0), a_round(1))
    write_metrics(tmp_path / "peer6", start, a_round(0), a_round(1), final(stopped=False))
    write_metrics(tmp_path / "peer7", start, a_round(0), final(stopped=True))
    write_metrics(tmp_path / "peer8", start, a_round(0))  # then it crashed
    codes = [None, None, None, None, None, None, 0, 130, 1]
    rows = peer_rows(tmp_path, 9, codes)
    states = [r["state"] for r in rows]
    assert states == [
        "starting",  # its process has written nothing yet
        "starting",
        "waiting-for-peers",
        "training 3/5",
        "exchanging",  # every inner step of the round done: its exchange is under way
        "stopping",
        "done",
        "stopped",
        "failed",
    ]
    assert rows[3]["step"] == 13 and rows[3]["round"] == 2  # live step from progress.json
    assert rows[6]["step"] == 10 and rows[6]["done"]  # an exited peer's from its records
    assert rows[3]["last_exchange"] == "outer:ok(2)"
    table = render(rows)
    assert [c.header for c in table.columns][-1] == "state"
    assert list(table.columns[-1].cells) == states


def test_a_peer_that_wrote_done_shows_done_before_its_process_exits(tmp_path: Path) -> None:
    write_metrics(tmp_path / "peer0", StartRecord(PEER, 1e9), a_round(0), final(stopped=False))
    ProgressFile(tmp_path / "peer0" / PROGRESS_FILE).phase("done")
    assert [r["state"] for r in peer_rows(tmp_path, 2)] == ["done", "starting"]  # no exit codes: running


@pytest.mark.parametrize("exit_code", [130, 143, -2, -15])
def test_a_peer_ended_by_a_stop_signal_shows_stopped(exit_code: int) -> None:
    assert peer_state(None, None, exit_code) == "stopped"


@pytest.mark.parametrize("exit_code", [1, -9, 137])
def test_a_peer_that_crashed_or_was_killed_shows_failed(exit_code: int) -> None:
    assert peer_state(None, None, exit_code) == "failed"


def test_a_failing_disk_is_logged_once_leaves_no_temp_files_and_recovery_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = run_dir / PROGRESS_FILE
    target.mkdir()  # a directory where the file should be: every rename over it fails
    progress = ProgressFile(target, period_s=3600)  # written here, not by its thread
    steps = iter(range(1, 100))
    progress.follow(lambda: Progress(round=1, round_step=next(steps), round_steps=50))
    with caplog.at_level("WARNING", logger="p2p_trainer.run.progress_file"):
        for _ in range(5):
            progress.write()
        failed = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(failed) == 1, [r.getMessage() for r in caplog.records]
        assert sorted(p.name for p in run_dir.iterdir()) == [PROGRESS_FILE], "temporary files left behind"
        target.rmdir()
        progress.write()
    assert any("works again after 5 failed writes" in r.getMessage() for r in caplog.records)
    progress.close()
    found = read_progress(target)
    assert found is not None and found[1].round_step == 6


def test_a_restarted_peer_does_not_show_its_last_life_s_progress(tmp_path: Path) -> None:
    opts = local_options(tmp_path, tiny_config("independent", rounds=1), peers=1)
    stale = tmp_path / "peer0" / PROGRESS_FILE
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"phase": "done", "round": 7, "round_step": 3, "round_steps": 3, "step": 21}))
    with LocalSwarm(opts) as swarm:
        swarm.start_peer(0)
        found = read_progress(stale)
        # gone before the new process starts; what is there now can only be its own "starting"
        assert found is None or found[0] == "starting", found
