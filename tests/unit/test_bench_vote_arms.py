"""`bench.vote_arms`: its runs' configs, and a folder that would resume an earlier run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.vote_arms import arm_config, main


def test_an_arm_names_its_method_and_robust_mean() -> None:
    together = arm_config("diloco", "trimmed", 7)
    assert together.outer.group_size == 0 and together.security.robust_mean == "trimmed"
    assert together.rounds == 7 and together.security.defences
    assert arm_config("factored", "mean", 7).outer.group_size == 2


def test_a_folder_left_by_an_earlier_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Peers resume from the checkpoints they find: a repetition in an old folder would not run."""
    (tmp_path / "flip_10-factored-rep0").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--reps", "1", "flip:10@factored"])
    assert exc.value.code == 2
    assert "use a new --out" in capsys.readouterr().err
