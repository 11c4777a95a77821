"""`bench/gpu_check.sh`'s measurement, in its CPU dry mode: every arm runs and is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_check


def test_the_dry_mode_measures_every_arm_against_bare_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_check.main(["--smoke", "--rounds", "1", "--out", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    rows = [r for r in lines if "arm" in r]
    arms = [
        "bare",
        "one peer",
        "two peers, diloco",
        "two peers, diloco, state on GPU",
        "two peers, diloco, H = 100",
    ]
    assert [r["arm"] for r in rows] == arms
    assert all(r["tokens_per_s"] > 0 and r["mfu"] >= 0 and r["peak_host_rss_gib"] > 0 for r in rows)
    assert rows[0]["ratio_to_bare"] == 1.0
    # on the CPU the outer state is host memory whatever `outer.offload` says: φ and m
    assert all(r["outer_state_on"] == "cpu" and r["outer_state_bytes"] > 0 for r in rows[1:])
    assert lines[-1]["peak_host_rss_gib"] > 0
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert len(saved["rows"]) == 5


def test_without_cuda_the_full_check_says_how_to_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the full check would run")
    assert gpu_check.main([]) == 2
    assert "--smoke" in capsys.readouterr().err
