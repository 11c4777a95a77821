"""An installed copy (a wheel of this checkout in a fresh venv, run from elsewhere) behaves like the checkout.

The fresh venv gets the project venv's site-packages for the dependencies (torch, hivemind, the
corpus) through a .pth file, never the checkout itself: the test asserts that `p2p_trainer` is
imported from the new venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from p2p_trainer.config import load_config, to_toml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(argv: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, start_new_session=True
    )
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a fresh venv with a (non-editable) wheel of this checkout installed."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy, so that building leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "p2p_trainer", src / "p2p_trainer", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp), str(src)], tmp, 300
    )
    (wheel,) = tmp.glob("p2p_trainer-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, 120)
    target = venv / "bin" / "python"
    _run([*pip, "--python", str(target), "install", "--no-deps", "--no-index", str(wheel)], tmp, 300)
    # dependencies from the project venv, added only now so that pip saw no other p2p-trainer
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def test_the_installed_copy_runs_the_checkouts_default_config(installed: Path, tmp_path: Path) -> None:
    where = _run(
        [str(installed / "python"), "-c", "import p2p_trainer; print(p2p_trainer.__file__)"], tmp_path, 60
    )
    module = Path(where.stdout.strip()).resolve()
    assert module.is_relative_to(installed.parent.resolve()), f"imported {module}, not the installed copy"
    shown = _run([str(installed / "p2p-trainer"), "config"], tmp_path, 120)
    assert shown.stdout == to_toml(load_config())
    assert "rounds = 15" in shown.stdout and "num_inner_steps = 20" in shown.stdout


def test_the_installed_copy_trains_a_local_swarm_from_elsewhere(installed: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = [str(installed / "p2p-trainer"), "local", "--peers", "2", "--rounds", "2", "--no-live"]
    _run([*argv, "--run-dir", str(run)], tmp_path, 420)
    assert (run / "config.toml").read_text() == to_toml(load_config(rounds=2))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "diloco" and summary["interrupted"] is False
    assert [p["rounds"] for p in summary["per_peer"]] == [2, 2]
