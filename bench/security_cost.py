"""What the security defences cost on the default run: utilisation with `defences` on and off.

Two measurements, the same machine, the same run:

1. **End to end.** `p2p-trainer local` on the packaged default config (`default.toml`: the 0.84M
   byte-level GPT, overlapped DiLoCo with int8 updates), `--peers P` for its own rounds (or
   `--rounds R`), once with `[security] defences = true` (the default) and
   once with `defences = false`, for each report seed; the arms alternate (on, off, off, on, ...) so
   drift of a shared machine cancels. Reported: each arm's median mean-utilisation (compute time
   over wall time, from `summary.json`) with its spread, and the median of the per-seed
   differences. Target (issue: signatures and checks cost <= 2% of utilisation).
2. **Per operation.** The checks' own time, isolated: sealing and verifying one heartbeat envelope,
   and the §10 contribution and result checks on one part of the default model's vector, each the
   median of many repetitions; with the default run's per-round counts this gives the checks'
   share of a round, which does not depend on the other processes' noise.

    .venv/bin/python -m bench.security_cost [--peers 2] [--rounds R] [--seeds 1,2,3] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nacl.signing
import numpy as np

from p2p_trainer.config import SecurityConfig, load_config, to_toml
from p2p_trainer.exchange.codecs import from_config
from p2p_trainer.net import envelope
from p2p_trainer.net.robust import Defence, Penalties, Scale, check_contribution, check_result
from p2p_trainer.train.model import build_model


def run_arm(defences: bool, seed: int, peers: int, rounds: int | None, out: Path) -> dict[str, Any]:
    cfg = load_config()
    cfg = dataclasses.replace(cfg, security=dataclasses.replace(cfg.security, defences=defences))
    cfg = cfg if rounds is None else dataclasses.replace(cfg, rounds=rounds)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "arm.toml"
    config.write_text(to_toml(cfg))
    argv = [sys.executable, "-m", "p2p_trainer", "local", "--config", str(config), "--peers", str(peers)]
    argv += ["--seed", str(seed), "--run-dir", str(out / "run"), "--no-live"]
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"local run failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((out / "run" / "summary.json").read_text())
    return {
        "defences": defences,
        "seed": seed,
        "utilisation": summary["mean_utilisation"],
        "wall_s": summary["wall_s"],
        "val_loss": summary["consensus_val_loss"],
        "elapsed_s": time.monotonic() - t0,
    }


def _median_s(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_operation(peers: int) -> dict[str, float]:
    """Median seconds of each check, and their sum per round of the default run."""
    cfg = load_config()
    n = build_model(cfg.model, cfg.seed).num_params()
    signer = envelope.Signer(nacl.signing.SigningKey(bytes(range(32))))
    body = b"x" * 300  # a heartbeat body is about this size
    sealed = signer.seal("p2p-trainer/cost/peers", signer.peer_id, 1e9, body)
    seal_s = _median_s(lambda: signer.seal("p2p-trainer/cost/peers", signer.peer_id, 1e9, body), 200)
    verify_s = _median_s(
        lambda: envelope.open_verified(sealed, "p2p-trainer/cost/peers", signer.peer_id, 1e9), 200
    )
    rng = np.random.default_rng(0)
    part = n // peers  # the group (every peer here) splits the vector in as many parts
    own = rng.standard_normal(part).astype(np.float32)
    ref = own - 0.01 * rng.standard_normal(part).astype(np.float32)
    other = own + 0.01 * rng.standard_normal(part).astype(np.float32)
    defence = Defence.of(SecurityConfig(), Penalties(6.0))
    codec, _ = from_config(cfg.exchange, update=True)  # the run's contributions' wire format
    scale = Scale.of(own, ref, str(codec.encode(own[:4096])[1]["dt"]))
    contribution_s = _median_s(lambda: check_contribution(other, scale, defence), 30)
    result_s = _median_s(lambda: check_result(other, scale, defence), 30)
    # per round of the default run, per peer: one heartbeat sealed per view period (2 s) and one
    # read of every peer's, and for each of its exchanges (DiLoCo: one, factored: two tags) one
    # contribution checked on its own part and one result checked on the other's
    exchanges = 2 if cfg.outer.method == "factored" else 1
    per_round = exchanges * (contribution_s + result_s)
    return {
        "params": float(n),
        "seal_s": seal_s,
        "verify_s": verify_s,
        "contribution_check_s": contribution_s,
        "result_check_s": result_s,
        "checks_per_round_s": per_round,
        "signatures_per_s": (seal_s + peers * verify_s) / cfg.network.view_period_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="default: the config's own")
    ap.add_argument("--seeds", default="1,2,3", help="report seeds (nothing is tuned here)")
    ap.add_argument("--out", default=None, help="directory for runs and results.json")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out or tempfile.mkdtemp(prefix="security-cost-"))
    ops = per_operation(args.peers)
    print(
        f"per operation ({int(ops['params']):,} params): seal {ops['seal_s'] * 1e6:.0f} us, "
        f"verify {ops['verify_s'] * 1e6:.0f} us, contribution check {ops['contribution_check_s'] * 1e3:.2f} ms, "
        f"result check {ops['result_check_s'] * 1e3:.2f} ms; checks per round {ops['checks_per_round_s'] * 1e3:.1f} ms, "
        f"signatures {ops['signatures_per_s'] * 1e3:.2f} ms per second of wall time"
    )
    load = os.getloadavg()
    rows = []
    for i, seed in enumerate(seeds):
        order = (True, False) if i % 2 == 0 else (False, True)
        for defences in order:
            row = run_arm(
                defences, seed, args.peers, args.rounds, out / f"seed{seed}-{'on' if defences else 'off'}"
            )
            rows.append(row)
            print(
                f"seed {seed} defences {'on ' if defences else 'off'}: utilisation {row['utilisation']:.4f}, "
                f"wall {row['wall_s']:.1f} s, consensus val loss {row['val_loss']:.4f}"
            )
    on = {r["seed"]: r["utilisation"] for r in rows if r["defences"]}
    off = {r["seed"]: r["utilisation"] for r in rows if not r["defences"]}
    diffs = [off[s] - on[s] for s in seeds]
    result = {
        "per_operation": ops,
        "runs": rows,
        "median_utilisation_on": statistics.median(on.values()),
        "median_utilisation_off": statistics.median(off.values()),
        "spread_on": [min(on.values()), max(on.values())],
        "spread_off": [min(off.values()), max(off.values())],
        "median_cost": statistics.median(diffs),
        "cost_spread": [min(diffs), max(diffs)],
        "load_before": load,
        "load_after": os.getloadavg(),
        "peers": args.peers,
        "rounds": args.rounds or load_config().rounds,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(
        f"utilisation with defences {result['median_utilisation_on']:.4f} "
        f"[{result['spread_on'][0]:.4f}, {result['spread_on'][1]:.4f}], without "
        f"{result['median_utilisation_off']:.4f} [{result['spread_off'][0]:.4f}, {result['spread_off'][1]:.4f}]; "
        f"cost (off - on) median {result['median_cost'] * 100:+.2f} points "
        f"[{result['cost_spread'][0] * 100:+.2f}, {result['cost_spread'][1] * 100:+.2f}] (target <= 2); "
        f"load {load[0]:.1f} -> {result['load_after'][0]:.1f}; results: {out / 'results.json'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
