from pathlib import Path

import torch

from p2p_trainer.train.snapshots import list_snapshots, load_snapshot, save_snapshot


def test_snapshots_round_trip_with_metadata_in_round_order(tmp_path: Path) -> None:
    tensors = [torch.randn(3, 4), torch.randn(5)]
    for rnd in (10, 2):
        save_snapshot(
            tmp_path, [t * rnd for t in tensors], round=rnd, step=rnd * 20, tokens=rnd * 99, time_s=rnd / 3
        )
    (tmp_path / ".r000003.safetensors.tmp1").write_bytes(b"half written")  # a write in progress
    infos = list_snapshots(tmp_path)
    assert [(s.round, s.step, s.tokens) for s in infos] == [(2, 40, 198), (10, 200, 990)]
    assert infos[0].time_s == 2 / 3
    for info, rnd in zip(infos, (2, 10), strict=True):
        for got, want in zip(load_snapshot(info.path), tensors, strict=True):
            torch.testing.assert_close(got, want * rnd)


def test_no_snapshot_directory_means_no_snapshots(tmp_path: Path) -> None:
    assert list_snapshots(tmp_path / "missing") == []
