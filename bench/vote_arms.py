"""`python -m bench.vote_arms --out DIR [--reps N] [--rounds R] ARM...`: attack arms, repeated.

Each ARM is `NAME@METHOD[/RULE]`: the attack (`p2p_trainer/lab/adversary`, or `clean` for none),
the method (`factored`: pairs; `diloco`: all four peers in one group) and the robust mean. Three
honest `join` peers and the hostile one run the tiny test model for `--rounds` rounds of 5 inner
steps on loopback (`lab/adversary/arena.py`, as `tests/integration/test_attacks.py` does), each
repetition in a folder of its own. It measures what agreed exclusion (`net/exclusion.py`) buys
over longer runs than the tests': the share of rounds each honest peer merged in full, and its
final validation loss. One JSON row per run goes to `DIR/rows.jsonl`; the table at the end gives
each arm's median and range.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from p2p_trainer.config import RunConfig
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.lab.adversary.arena import run_attack
from p2p_trainer.lab.adversary.attacks import parse_attack
from p2p_trainer.lab.tiny_run import tiny_config

BOUNDED_WAITS = {"quorum_wait_max_s": 4.0, "grace_max_s": 2.0, "grace_min_s": 1.0, "mix1_grace_s": 2.0}
"""As in the attack tests: a member that never contributes costs a few seconds, not 30."""


def arm_config(method: str, rule: str, rounds: int) -> RunConfig:
    """The attack tests' tiny run; `diloco` puts all four peers in one group."""
    cfg = tiny_config(method, rounds=rounds, h=5, **BOUNDED_WAITS)
    if method == "diloco":
        cfg = dataclasses.replace(cfg, outer=dataclasses.replace(cfg.outer, group_size=0))
    return dataclasses.replace(cfg, security=SecurityConfig(robust_mean=rule))  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vote_arms", description=__doc__.split("\n")[0])
    parser.add_argument(
        "arms", nargs="+", help="NAME@METHOD[/RULE], e.g. flip:10@factored, drift:5@diloco/trimmed"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=120)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rep in range(args.reps):
        for arm in args.arms:
            name, _, how = arm.partition("@")
            method, _, rule = how.partition("/")
            cfg = arm_config(method or "factored", rule or "mean", args.rounds)
            attack = None if name == "clean" else parse_attack(name)
            folder = args.out / f"{arm.replace('/', '-').replace(':', '_').replace('@', '-')}-rep{rep}"
            if folder.exists():
                parser.error(f"{folder} exists: a run resumes from the checkpoints it finds; use a new --out")
            out = run_attack(folder, cfg, attack, timeout_s=180.0 * max(1.0, args.rounds / 30) ** 0.5)
            row = {
                "arm": arm,
                "rep": rep,
                "finished": out.finished,
                "rounds": out.final_rounds,
                "loss": out.val_losses,
                "merged": [round(s, 3) for s in out.merged_share],
                "wall_s": round(out.wall_s, 1),
            }
            print(json.dumps(row), flush=True)
            with open(args.out / "rows.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
    print("\n| arm | runs | merged, median (range) | loss, median (range) | wall s |\n|---|---|---|---|---|")
    for arm in args.arms:
        mine = [r for r in rows if r["arm"] == arm]
        merged = [m for r in mine for m in r["merged"]]
        losses = [v for r in mine for v in r["loss"] if v is not None]
        walls = [r["wall_s"] for r in mine]
        print(
            f"| {arm} | {len(mine)} | {statistics.median(merged):.2f} ({min(merged):.2f}–{max(merged):.2f}) | "
            f"{statistics.median(losses):.3f} ({min(losses):.3f}–{max(losses):.3f}) | "
            f"{', '.join(f'{w:.0f}' for w in walls)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
