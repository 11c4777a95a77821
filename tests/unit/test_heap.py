"""A training peer keeps freed memory for its next inner step (p2p_trainer/heap.py).

Each run is its own process: the allocator's settings are process-wide and cannot be undone, and
the control arm sets glibc's initial thresholds (128 KiB) through the environment variables the
settings defer to (fixed there, where glibc would raise its mmap threshold as blocks are freed).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

STEPS = """
import resource
from p2p_trainer.algo.methods import RoundReport
from p2p_trainer.config import InnerConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer

cfg = RunConfig(rounds=1, inner=InnerConfig(warmup_steps=0), outer=OuterConfig.for_method("independent"))
peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), load_corpus(cfg.data, cfg.model.seq_len), "p0")
report = RoundReport(0)
for _ in range(3):
    peer.inner_step(report)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    peer.inner_step(report)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 4)
"""

GLIBC_DEFAULTS = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _faults_per_step(extra_env: dict[str, str]) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(extra_env, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", STEPS], env=env, capture_output=True, text=True, timeout=240, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator settings only")
def test_a_peers_inner_steps_reuse_freed_memory() -> None:
    # the default model's step frees and reallocates tens of MB of activations: glibc left to
    # itself (no settings, no variables) took 11,000 fresh pages per step, the settings under 50
    kept = _faults_per_step({})
    returned = _faults_per_step(GLIBC_DEFAULTS)
    assert returned > 2000, returned
    assert kept < returned // 10, (kept, returned)
