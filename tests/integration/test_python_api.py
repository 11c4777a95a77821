"""The Python API's example (docs/examples/own_model.py), run as it is by two peers of a real swarm:
a bootstrap node and two processes, each with its own DHT node and p2p daemon, on loopback."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from p2p_trainer.processes import Child, group_gone, wait_all
from p2p_trainer.run.launcher import LOOPBACK, bootstrap_argv, read_initial_peers, thread_env

pytestmark = pytest.mark.timeout(180)
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "own_model.py"
ROUNDS = 6
ROUND_LINE = re.compile(r"round (\d+): loss ([0-9.]+), merged with (\d+) peers")
FINAL_LINE = re.compile(r"final: validation loss ([0-9.]+), agreed with (\d+) peers")


def test_the_example_trains_one_model_in_a_two_peer_swarm(tmp_path: Path) -> None:
    boot_log = tmp_path / "bootstrap.log"
    boot = Child("bootstrap", bootstrap_argv(tmp_path / "bootstrap.key"), boot_log)
    children = [boot]
    try:
        initial_peers = read_initial_peers(boot.proc, boot_log, timeout_s=60)
        for i in range(2):
            argv = [sys.executable, str(EXAMPLE), *initial_peers.split(), "--host", LOOPBACK]
            argv += ["--rounds", str(ROUNDS), "--save", str(tmp_path / f"model{i}.pt")]
            children.append(Child(f"peer{i}", argv, tmp_path / f"peer{i}.log", thread_env(1)))
        assert wait_all(children[1:], timeout_s=150), "the example's peers did not finish"
        logs = {c.name: (tmp_path / f"{c.name}.log").read_text()[-2000:] for c in children[1:]}
        assert all(c.proc.returncode == 0 for c in children[1:]), logs
        outputs = [c.proc.stdout.read().decode() for c in children[1:] if c.proc.stdout is not None]
    finally:
        for child in reversed(children):
            child.stop(timeout_s=20)
    for out in outputs:
        rounds = [(int(r), float(loss), int(n)) for r, loss, n in ROUND_LINE.findall(out)]
        assert [r for r, _, _ in rounds] == list(range(ROUNDS)), out
        # one round's training loss is a few small batches of each peer's own random samples:
        # the later half of the run, averaged, against the first round
        later = [loss for _, loss, _ in rounds[ROUNDS // 2 :]]
        assert sum(later) / len(later) < 0.6 * rounds[0][1], f"the loss did not go down: {out}"
        merged = sum(n == 2 for _, _, n in rounds)
        assert merged >= ROUNDS - 1, f"merged with the other peer in {merged} of {ROUNDS} rounds: {out}"
        final = FINAL_LINE.search(out)
        assert final is not None and final.group(2) == "2", out
    models = [torch.load(tmp_path / f"model{i}.pt") for i in range(2)]
    for name, value in models[0].items():  # the final agreement left both peers one model
        torch.testing.assert_close(value, models[1][name])
    for child in children:
        assert group_gone(child.pid), f"{child.name}'s processes survived"
