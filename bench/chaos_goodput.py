"""Goodput under a kill schedule: our stack vs checkpoint-and-restart DiLoCo, in the same run.

    python -m bench.chaos_goodput [--quick] [--out DIR]

Three real-process swarms on loopback, one after the other, all with N peers and the same
schedule of SIGKILLs (one every `kill_every_s`, peers in turn, starting `kill_every_s` after the
swarm's first round):

1. ours under churn: factored gossip (or noloco) with constant work per round (§6); a killed peer
   is restarted `restart_delay_s` later with the same identity and late-joins the swarm's state;
   the others never stop. Runs until every peer has finished `rounds` outer rounds.
2. checkpoint-and-restart DiLoCo (§1, blocking all-peer rounds, checkpoint every
   `checkpoint_every` rounds): on a kill the whole job goes down (every peer SIGKILLed; failure
   detection is taken as instant, which favours the baseline), and `restart_delay_s` later every
   peer is relaunched with --resume from its last checkpoint. Runs for the wall time that (1) took.
3. ours failure-free, same rounds: the reference for the loss comparison.

Goodput = useful tokens / tokens the peers could have processed. Useful: tokens of every outer
round whose result the swarm kept: for (1) every committed round of every peer (a late joiner's
earlier rounds were already merged into the others); for (2) committed rounds not rolled back by a
restart. Could have processed: peers × wall time × one peer's inner-step throughput (median
tokens per compute-second, measured in the same arm, since the arms run one after another on a
shared machine). Wall time runs from the swarm's first round; both arms get the same window.
The anchor is ReCoVer's 2.23× effective throughput over checkpoint-restart (arXiv 2605.11215).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from safetensors import safe_open

from p2p_trainer.config import (
    DataConfig,
    ExchangeConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    RunConfig,
    to_toml,
)
from p2p_trainer.lab.chaos.nodes import ChaosSwarm, Node
from p2p_trainer.lab.chaos.report import peer_summary
from p2p_trainer.lab.chaos.runner import run_scenario
from p2p_trainer.lab.chaos.timeline import ChaosScenario, Event
from p2p_trainer.round_log import RunLog, read_log
from p2p_trainer.run.launcher import LocalOptions
from p2p_trainer.train.checkpoint import atomic_write_text

RECOVER_RATIO = 2.23

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Plan:
    peers: int = 4
    rounds: int = 60
    num_inner_steps: int = 30
    kill_every_s: float = 60.0
    kills: int | None = None
    """Stop killing after this many (None: every `kill_every_s` for as long as the run lasts)."""
    restart_delay_s: float = 5.0
    checkpoint_every: int = 5
    method: str = "factored"
    d_model: int = 64
    seq_len: int = 64
    batch_size: int = 8


QUICK = Plan(peers=3, rounds=300, num_inner_steps=20, kill_every_s=30.0, d_model=32, seq_len=32, batch_size=4)


def run_config(plan: Plan, method: str, constant_work: bool) -> RunConfig:
    micro = plan.batch_size * plan.seq_len
    target = plan.peers * plan.num_inner_steps * micro if constant_work else 0
    exchange = ExchangeConfig(timeout_s=5.0)
    if method == "factored":
        exchange = dataclasses.replace(exchange, mix1_grace_s=2.0)
    return RunConfig(
        seed=0,
        rounds=plan.rounds,
        model=ModelConfig(d_model=plan.d_model, n_layers=2, n_heads=2, seq_len=plan.seq_len),
        data=DataConfig(batch_size=plan.batch_size, val_batches=8),
        inner=InnerConfig(eval_every=0, warmup_steps=10),
        outer=OuterConfig.for_method(
            method, num_inner_steps=plan.num_inner_steps, target_tokens_per_round=target
        ),
        exchange=exchange,
    )


def kill_times(plan: Plan, horizon_s: float) -> list[tuple[float, int]]:
    n = int(horizon_s // plan.kill_every_s)
    if plan.kills is not None:
        n = min(n, plan.kills)
    return [((k + 1) * plan.kill_every_s, k % plan.peers) for k in range(n)]


# ----------------------------------------------------------------------------- metrics
def _log(run_dir: Path, i: int) -> RunLog:
    return read_log(run_dir / f"peer{i}" / "metrics.jsonl")


def first_round_unix(run_dir: Path, peers: int) -> float:
    return min(r.unix_time - r.wall_s for i in range(peers) for r in _log(run_dir, i).rounds)


def useful_tokens(run_dir: Path, peers: int, t_start: float, window_s: float) -> int:
    """Tokens of committed rounds inside the window that no later life of the same peer redid."""
    total = 0
    for i in range(peers):
        kept: dict[int, int] = {}
        for r in _log(run_dir, i).rounds:
            if r.unix_time > t_start + window_s:
                continue
            for rnd in [k for k in kept if k >= r.round]:  # a restart rolled these back
                del kept[rnd]
            kept[r.round] = r.round_tokens
        total += sum(kept.values())
    return total


def compute_rate(run_dir: Path, peers: int) -> float:
    """Median tokens per second of inner steps over all rounds of all peers."""
    rates = [
        r.round_tokens / r.compute_s for i in range(peers) for r in _log(run_dir, i).rounds if r.compute_s > 0
    ]
    return statistics.median(rates)


def final_losses(run_dir: Path, peers: int, rounds: int) -> list[float]:
    """Validation loss of every peer that finished all `rounds` (the survivors at the end)."""
    out = []
    for i in range(peers):
        finals = [f for f in _log(run_dir, i).finals if f.round >= rounds]
        if finals and finals[-1].val_loss is not None:
            out.append(finals[-1].val_loss)
    return out


# ----------------------------------------------------------------------------- arms
def ours(plan: Plan, out: Path, kills: bool) -> dict[str, Any]:
    events: list[Event] = []
    if kills:
        for at_s, peer in kill_times(plan, 3600.0):
            events += [Event(at_s, "kill", peer), Event(at_s + plan.restart_delay_s, "restart", peer)]
    scenario = ChaosScenario(
        name="ours-churn" if kills else "ours-failure-free",
        peers=plan.peers,
        run=run_config(plan, plan.method, constant_work=True),
        events=tuple(events),
    )
    report = run_scenario(scenario, out)
    t0 = first_round_unix(out, plan.peers)
    ends = [r.unix_time for i in range(plan.peers) for r in _log(out, i).rounds]
    window_s = max(ends) - t0
    return {
        "report": report,
        "t0": t0,
        "window_s": window_s,
        "kills": sum(1 for e in report["events"] if e["event"].startswith("kill")),
        "useful_tokens": useful_tokens(out, plan.peers, t0, window_s),
        "final_val_loss": final_losses(out, plan.peers, plan.rounds),
    }


def _checkpoint_round(path: Path) -> int:
    with safe_open(str(path), framework="pt") as f:
        return int(json.loads((f.metadata() or {})["p2p_trainer"])["round"])


def _reconcile_checkpoints(out: Path, peers: int) -> int:
    """Every peer restarts from the same round: the oldest checkpoint among them.

    DiLoCo's all-reduce leaves every peer with the same anchor and momentum, so a peer whose
    checkpoint is a round ahead (it saved before the job went down) takes a copy of a peer's at
    the common round (its own AdamW moments and data position then come from that peer).
    """
    paths = [out / f"peer{i}" / "checkpoint.safetensors" for i in range(peers)]
    rounds = [_checkpoint_round(p) if p.exists() else -1 for p in paths]
    common = min(rounds)
    if common < 0:
        for p in paths:  # someone never checkpointed: the whole job starts over
            p.unlink(missing_ok=True)
        return 0
    source = paths[rounds.index(common)]
    for p, r in zip(paths, rounds, strict=True):
        if r != common:
            shutil.copyfile(source, p)
    return common


def checkpoint_restart_diloco(plan: Plan, out: Path, window_s: float) -> dict[str, Any]:
    # trains through the whole window (a round bound would let it finish early and idle)
    cfg = dataclasses.replace(run_config(plan, "diloco", constant_work=False), rounds=1_000_000)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.toml"
    atomic_write_text(config_path, to_toml(cfg))
    opts = LocalOptions(config_path=config_path, run=cfg, peers=plan.peers, run_dir=out, torch_threads=1)
    swarm = ChaosSwarm(opts)
    # a checkpoint-restart job starts only with all its workers (however long they take to start)
    every = ["--checkpoint-every", str(plan.checkpoint_every), "--wait-timeout-s", "900"]
    boot = swarm.start_bootstrap()
    nodes: dict[int, Node] = {}
    restarts: list[dict[str, Any]] = []
    try:
        nodes = {i: swarm.start_peer(i, every) for i in range(plan.peers)}
        while not any(_log(out, i).rounds for i in range(plan.peers)):
            time.sleep(0.1)
        t0_mono, t0 = time.monotonic(), first_round_unix(out, plan.peers)
        for at_s, peer in kill_times(plan, window_s):
            while time.monotonic() < t0_mono + at_s:
                time.sleep(0.05)
            for i in [peer] + [j for j in nodes if j != peer]:  # the failure, then the job goes down
                nodes[i].kill()
            time.sleep(plan.restart_delay_s)
            common = _reconcile_checkpoints(out, plan.peers)
            restarts.append(
                {"at_s": round(time.monotonic() - t0_mono, 1), "killed": peer, "resume_round": common}
            )
            nodes = {i: swarm.start_peer(i, [*every, "--resume"]) for i in range(plan.peers)}
        while time.monotonic() < t0_mono + window_s and any(n.alive() for n in nodes.values()):
            time.sleep(0.1)
    finally:
        for node in nodes.values():
            node.stop(timeout_s=30)
        boot.stop(timeout_s=10)
    return {
        "t0": t0,
        "window_s": window_s,
        "restarts": restarts,
        "useful_tokens": useful_tokens(out, plan.peers, t0, window_s),
        "final_round": min((peer_summary(out, i)["last_round"] or 0) for i in range(plan.peers)),
    }


# ----------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 tiny peers, a kill every 30 s (~8 min)")
    parser.add_argument(
        "--out", type=Path, default=Path(f"runs/chaos-goodput-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    parser.add_argument("--method", choices=["factored", "noloco"], default="factored")
    parser.add_argument("--peers", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--inner-steps", type=int, default=None, help="H: inner steps per outer round")
    parser.add_argument("--kill-every-s", type=float, default=None)
    parser.add_argument("--skip-failure-free", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    plan = dataclasses.replace(QUICK if args.quick else Plan(), method=args.method)
    if args.peers:
        plan = dataclasses.replace(plan, peers=args.peers)
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    if args.inner_steps:
        plan = dataclasses.replace(plan, num_inner_steps=args.inner_steps)
    if args.kill_every_s:
        plan = dataclasses.replace(plan, kill_every_s=args.kill_every_s)
    args.out.mkdir(parents=True, exist_ok=True)

    churn = ours(plan, args.out / "ours-churn", kills=True)
    base = checkpoint_restart_diloco(plan, args.out / "diloco-ckpt-restart", churn["window_s"])
    free = None if args.skip_failure_free else ours(plan, args.out / "ours-failure-free", kills=False)
    # The arms run one after another on a shared machine: each one's capacity uses the per-peer
    # inner-step throughput measured in that arm, so background load does not decide the ratio.
    window = churn["window_s"]
    for arm, name in ((churn, "ours-churn"), (base, "diloco-ckpt-restart")):
        arm["tokens_per_compute_s"] = compute_rate(args.out / name, plan.peers)
        arm["capacity_tokens"] = plan.peers * window * arm["tokens_per_compute_s"]
        arm["goodput"] = arm["useful_tokens"] / arm["capacity_tokens"]
    result: dict[str, Any] = {
        "plan": dataclasses.asdict(plan),
        "window_s": window,
        "ours": {k: v for k, v in churn.items() if k != "report"},
        "ours_tokens_per_round": churn["report"]["tokens_per_round"],
        "ours_longest_pause_s": churn["report"]["longest_pause_s"],
        "baseline": base,
        "goodput_ours": churn["goodput"],
        "goodput_baseline": base["goodput"],
        "ratio": churn["goodput"] / max(1e-9, base["goodput"]),
        "useful_token_ratio": churn["useful_tokens"] / max(1, base["useful_tokens"]),
    }
    if free is not None:
        rate = compute_rate(args.out / "ours-failure-free", plan.peers)
        result["failure_free"] = {k: v for k, v in free.items() if k != "report"}
        result["goodput_failure_free"] = free["useful_tokens"] / (plan.peers * free["window_s"] * rate)
        churn_loss = statistics.fmean(churn["final_val_loss"])
        free_loss = statistics.fmean(free["final_val_loss"])
        result["loss_churn"], result["loss_failure_free"] = churn_loss, free_loss
        result["loss_difference"] = churn_loss - free_loss
    atomic_write_text(args.out / "goodput.json", json.dumps(result, indent=2))
    tpr = result["ours_tokens_per_round"]
    print(f"\n{plan.peers} peers, one kill every {plan.kill_every_s:.0f} s, window {window:.0f} s")
    print(
        f"  ours ({plan.method}, constant work): {churn['kills']} kills, useful tokens {churn['useful_tokens']}, goodput {result['goodput_ours']:.3f}"
    )
    print(
        f"  checkpoint-restart DiLoCo (ckpt every {plan.checkpoint_every} rounds): {len(base['restarts'])} restarts, useful tokens {base['useful_tokens']}, goodput {result['goodput_baseline']:.3f}"
    )
    print(
        f"  effective-throughput ratio ours / checkpoint-restart: {result['ratio']:.2f}x (ReCoVer reports {RECOVER_RATIO}x)"
    )
    if tpr.get("counted_rounds"):
        print(
            f"  tokens per round vs target {tpr['target']}: mean |dev| {100 * tpr['mean_abs_deviation']:.1f}%, "
            f"max {100 * tpr['max_abs_deviation']:.1f}%, {tpr['within_5pct']}/{tpr['counted_rounds']} rounds within 5%"
        )
    if free is not None:
        print(
            f"  final val loss after {plan.rounds} rounds: churn {result['loss_churn']:.4f}, failure-free "
            f"{result['loss_failure_free']:.4f}, difference {result['loss_difference']:+.4f} nats/byte (bound 0.05)"
        )
    print(f"  details: {args.out / 'goodput.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
