"""`python -m bench.wan --quick` end to end on the WAN testbed: the pipeline and sane numbers.

Checks the sanity of what was measured, not the targets: data-parallel has the
best loss per token, and every peer's interface counters agree with the bytes the exchanges must
move within 5%. Whether independent training is the worst per token is what the bench measures,
not a property of the harness (at this tiny model and horizon DiLoCo is worse per token, in
process too), so it is printed, not asserted. Skipped, with the reason, without root/netns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2p_trainer.round_log import read_log
from tests.conftest import skip_unless_supported

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.timeout(960)
def test_quick_wan_bench_measures_sane_numbers(tmp_path: Path) -> None:
    skip_unless_supported()
    out = tmp_path / "wan"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.wan", "--quick", "--out", str(out)],
        cwd=REPO,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=930,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("results.json", "table.md", "loss_vs_time.png", "loss_vs_tokens.png", "utilisation.png"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    summary = results["summary"]
    assert set(summary) == {"bare", "data-parallel", "diloco", "factored-mix2-k2", "independent", "hivemind"}
    for name, s in summary.items():
        assert s["utilisation"] is not None and 0 < s["utilisation"] <= 1.0, name
        assert s["final_loss"] is not None and s["final_loss"] < 5.0, name  # trained (5.55 = uniform)
    # every method that communicates moved bytes; independent peers made no exchange at all (their
    # interface counters still show the DHT's control plane, which a 25 s run's DiLoCo does not
    # dwarf: 0.7 MB against 10 MB per peer)
    assert summary["diloco"]["tx_bytes_per_peer"] > 0
    for log in (out / "report" / "independent-s0").glob("peer*/metrics.jsonl"):
        rounds = read_log(log).rounds
        assert rounds and all(r.exchanges == () and r.bytes_sent == 0 for r in rounds), log
    sanity = results["sanity"]
    assert sanity["data_parallel_best_per_token"], sanity["loss_at_equal_tokens"]
    assert sanity["bytes_within_5pct"], sanity["bytes_vs_theory"]
    assert results["targets"], "the targets are printed as ratios"
    assert results["hivemind_lr"]["ok"], results["hivemind_lr"]  # its schedule took effect
    assert results["ideal"], "the ideal run gives the fraction of ideal collaboration"
    for name, s in summary.items():
        assert s["throughput_vs_bare"] is not None and s["fraction_of_ideal_mean_peer"] is not None, name
