"""The command line: one name per notion across commands, and `--help` without torch or hivemind."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from p2p_trainer.cli import main

HEAVY = ("torch", "hivemind", "numpy", "matplotlib")
"""What `--help` must not load: each takes from 0.3 s to several seconds to import."""


def _imported_modules(argv: list[str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "p2p_trainer", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Usage:" in proc.stdout
    # -X importtime writes "import time: self | cumulative | name" per module to stderr
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return {row[-1].strip() for row in rows if len(row) == 3}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["join", "--help"],
        ["local", "--help"],
        ["bootstrap", "--help"],
        ["simulate", "--help"],
        ["status", "--help"],
        ["dashboard", "--help"],
        ["config", "show", "--help"],
        ["tokenizer", "train", "--help"],
        ["sample", "--help"],
        ["evaluate", "--help"],
    ],
)
def test_help_answers_without_importing_torch(argv: list[str]) -> None:
    modules = _imported_modules(argv)
    assert "click" in modules  # the probe sees imports at all
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"`p2p-trainer {' '.join(argv)}` imported {heavy[:5]}"


def _options(command: str) -> dict[str, click.Option]:
    cmd = main.commands[command]
    return {opt: p for p in cmd.params if isinstance(p, click.Option) for opt in p.opts}


def test_shared_notions_have_one_name_and_type_everywhere() -> None:
    shared = {
        ("local", "join", "inprocess", "config"): ["--config", "--method", "--rounds", "--seed"],
        ("local", "join"): ["--minutes", "--run-dir"],
        ("join", "bootstrap"): [
            *("--host", "--port", "--announce-host", "--identity", "--initial-peers"),
            *("--metrics-port", "--metrics-host", "--log-format"),
        ],
        ("join", "bootstrap", "status", "dashboard"): ["--initial-peers"],
        ("join", "dashboard"): ["--host", "--port", "--run-dir"],
    }
    for commands, names in shared.items():
        for name in names:
            found = [_options(c).get(name) for c in commands]
            assert all(found), f"{name} missing from one of {commands}"
            kinds = {type(o.type).__name__ for o in found if o is not None}
            assert len(kinds) == 1, f"{name} has different types in {commands}: {kinds}"
    assert "--run-dir" in _options("chaos")
    for command in main.commands:
        assert "--max-minutes" not in _options(command), command
        # simulate writes a report, not a run: its --out is another notion
        assert command == "simulate" or "--out" not in _options(command), command


def test_method_choices_are_the_configs() -> None:
    from p2p_trainer.config import METHODS

    method = _options("join")["--method"]
    assert isinstance(method.type, click.Choice) and tuple(method.type.choices) == METHODS
