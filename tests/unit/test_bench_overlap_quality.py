"""The overlapped-DiLoCo quality bench runs end to end at a toy budget and reports every arm."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.overlap_quality import main


def test_the_bench_reports_every_arm_per_seed(tmp_path: Path) -> None:
    assert main(["--seeds", "5", "--rounds", "1", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["arm"] for r in runs] == ["independent", "diloco", "overlap", "overlap-tuned", "land-5"]
    assert all(math.isfinite(r["mean_peer_loss"]) and r["failed"] == 0 for r in runs)
    table = (tmp_path / "table.md").read_text()
    assert all(
        f"| {arm} |" in table for arm in ("independent", "diloco", "overlap", "overlap-tuned", "land-5")
    )
