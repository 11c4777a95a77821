"""The `simulate` command and its report files."""

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from p2p_trainer.lab.sim import Scenario, simulate
from p2p_trainer.lab.sim.command import simulate as simulate_command
from p2p_trainer.train.atomic_files import atomic_write_bytes

SMALL = ["--num-chips", "64", "--num-peers", "8", "--chips-per-slice", "8", "--horizon-s", "7200"]


def test_command_writes_results_table_and_plots(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("[scenario]\nnum_chips = 32\nnum_peers = 4\nchips_per_slice = 4\nseed = 5\n")
    out = tmp_path / "out"
    args = [
        "--scenario",
        str(scenario),
        *SMALL,
        "--method",
        "noloco",
        "--method",
        "diloco",
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(simulate_command, args)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert data["scenario"]["num_chips"] == 64  # options override the file
    assert data["scenario"]["seed"] == 5  # the file's values stay otherwise
    assert sorted(data["results"]) == ["diloco", "noloco"]
    assert "| noloco |" in (out / "table.md").read_text()
    for png in ("goodput_over_time.png", "round_times.png", "summary.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp"))


def test_command_reports_invalid_scenario_as_usage_error() -> None:
    res = CliRunner().invoke(simulate_command, ["--num-chips", "100", "--num-peers", "16"])
    assert res.exit_code == 2
    assert "multiple of num_peers" in res.output


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    atomic_write_bytes(path, b"first version, longer")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_goodput_series_integrates_to_the_total() -> None:
    s = Scenario(
        num_chips=4096, num_peers=16, mtbi_chip_s=86400.0 * 20, horizon_s=6 * 3600.0, straggler_sigma=0.2
    )
    for name, r in simulate(s).items():
        assert abs(np.mean(r.series_goodput) - r.goodput) < 1e-6, name
