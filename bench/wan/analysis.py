"""What a WAN-bench run measured: loss curves from snapshots, utilisation, blocking, bytes, consensus.

Everything here reads files a finished run left behind (metrics.jsonl, snapshots, checkpoints,
run.json with interface counters); evaluation happens after training, so it costs no training time.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from p2p_trainer.algo.streaming import TAG as FRAGMENT_TAG
from p2p_trainer.algo.streaming import split_fragments
from p2p_trainer.config import RunConfig
from p2p_trainer.round_log import RoundRecord, read_log
from p2p_trainer.train.data import load_corpus, validation_batches
from p2p_trainer.train.model import build_model


class Evaluator:
    """Validation loss (nats/byte) of parameter lists, on the fixed validation batches."""

    def __init__(self, cfg: RunConfig) -> None:
        self.model = build_model(cfg.model, cfg.seed)
        corpus = load_corpus(cfg.data, cfg.model.seq_len)
        self.batches = validation_batches(
            corpus, cfg.model.seq_len, cfg.data.batch_size, cfg.data.val_batches
        )
        self.num_params = sum(p.numel() for p in self.model.parameters())

    @torch.no_grad()
    def loss(self, tensors: list[torch.Tensor]) -> float:
        for p, t in zip(self.model.parameters(), tensors, strict=True):
            p.copy_(t)
        self.model.eval()
        return sum(float(self.model(x, y)) for x, y in self.batches) / len(self.batches)


def pctl(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else None


def exchanged_params(tag: str, group: str, num_params: int, fragments: list[int] | None) -> int:
    """Values one exchange moves: the whole model's, or with Streaming DiLoCo the fragment its
    group key names (`<run>/fragment/<round>/<fragment>/<members>`; `fragments`: each one's values)."""
    if tag != FRAGMENT_TAG or not fragments:
        return num_params
    fields = group.split("/")
    if len(fields) < 5 or not fields[3].isdigit() or int(fields[3]) >= len(fragments):
        raise ValueError(f"fragment exchange {group!r} names none of the {len(fragments)} fragments")
    return fragments[int(fields[3])]


def fragment_params(cfg: RunConfig) -> list[int] | None:
    """Values per fragment where the run streams fragments (`outer.fragments` > 1), else None."""
    if cfg.outer.method != "diloco" or cfg.outer.fragments <= 1:
        return None
    sizes = [p.numel() for p in build_model(cfg.model, cfg.seed).parameters()]
    return [sum(sizes[i] for i in chosen) for chosen in split_fragments(sizes, cfg.outer.fragments)]


def pair_bytes(group: int, num_params: int, value_bytes: float = 4.0) -> float:
    """Bytes one member sends (and receives) in a butterfly average over `group` (float32: 4 bytes)."""
    return 2 * (group - 1) / group * value_bytes * num_params if group > 1 else 0.0


def bound_s(group: int, num_params: int, rate_mbit: float, value_bytes: float = 4.0) -> float:
    """The physical bound of one member's exchange: its butterfly bytes / link rate."""
    return pair_bytes(group, num_params, value_bytes) * 8 / (rate_mbit * 1e6)


# ------------------------------------------------------------------------------------------- curves
def loss_at_time(curve: list[dict[str, float]], t: float) -> float | None:
    before = [p for p in curve if p["time_s"] <= t]
    return before[-1]["val_loss"] if before else None


def loss_at_tokens(curve: list[dict[str, float]], tokens: float) -> float | None:
    for a, b in itertools.pairwise(curve):
        if a["tokens"] <= tokens <= b["tokens"]:
            w = (tokens - a["tokens"]) / max(1.0, b["tokens"] - a["tokens"])
            return a["val_loss"] + w * (b["val_loss"] - a["val_loss"])
    if curve and abs(curve[-1]["tokens"] - tokens) < 1:
        return curve[-1]["val_loss"]
    return None


def time_to_loss(curve: list[dict[str, float]], target: float) -> float | None:
    return next((p["time_s"] for p in curve if p["val_loss"] <= target), None)


# ------------------------------------------------------------------------------------------- one run
HEADER_BYTES_PER_PACKET = 66
"""Ethernet (14) + IPv4 (20) + TCP with timestamps (32): what every packet adds to its payload."""


def consensus_distance(anchors: list[list[torch.Tensor]]) -> float | None:
    """mean_i ‖φ_i − φ̄‖ / ‖φ̄‖ over the flattened anchors (docs/algorithms.md §8)."""
    if len(anchors) < 2:
        return None
    flat = torch.stack([torch.cat([t.reshape(-1).float() for t in a]) for a in anchors])
    mean = flat.mean(0)
    return float((flat - mean).norm(dim=1).mean() / mean.norm())


def _peer_stats(
    all_rounds: list[RoundRecord],
    budget_s: float,
    peers: int,
    rate_mbit: float,
    num_params: int,
    value_bytes: float = 4.0,
    fragments: list[int] | None = None,
) -> tuple[dict[str, Any], list[float], dict[str, list[float]]]:
    """Timing from the rounds that ended within the budget (a peer that outlived the others' budget
    waits out an exchange timeout: not a round of the method); bytes theory from every round."""
    rounds = [r for r in all_rounds if r.time_s <= budget_s]
    compute, wall = sum(r.compute_s for r in rounds), sum(r.wall_s for r in rounds)
    steps = rounds[-1].step if rounds else 0
    blocked = [r.blocked_s for r in rounds]
    ratios: dict[str, list[float]] = {}
    theory = theory_failed = 0.0
    groups: dict[str, list[int]] = {}
    for r in all_rounds:
        for e in r.exchanges:
            if e.ok and (e.group_size >= 2 or e.group_size == 0):
                groups.setdefault(e.tag, []).append(e.group_size if e.group_size > 0 else peers)
    for r in all_rounds:
        for e in r.exchanges:
            g = e.group_size if e.group_size > 0 else peers  # hivemind: all peers
            usual = groups.get(e.tag)
            n = exchanged_params(e.tag, e.group, num_params, fragments)
            if not e.ok:
                # a failed exchange records a group of one, but moved (most of) its bytes first:
                # charge it the tag's usual group
                theory_failed += pair_bytes(statistics.mode(usual), n, value_bytes) if usual else 0.0
                continue
            if g < 2 and e.merged and usual:
                # a partial merge (some parts came back, others kept as own values) records the
                # smallest part's group, one: it sent and waited for the whole group's bytes
                g = statistics.mode(usual)
            if g < 2:
                continue
            theory += pair_bytes(g, n, value_bytes)
            if r.time_s <= budget_s:
                bound = bound_s(g, n, rate_mbit, value_bytes)
                ratios.setdefault(e.tag, []).append(e.elapsed_s / bound)
    exchanges = [e for r in rounds for e in r.exchanges]
    stats = {
        "rounds": len(rounds),
        "steps": steps,
        "utilisation": compute / wall if wall else None,
        "round_time_s": wall / len(rounds) if rounds else None,
        "step_compute_s": compute / steps if steps else None,
        "theory_bytes": theory,
        "theory_bytes_failed": theory_failed,
        "failed_exchanges": sum(1 for e in exchanges if not e.ok),
        "partial_merges": sum(1 for e in exchanges if e.ok and e.merged and 0 < e.group_size < 2),
        "exchanges": len(exchanges),
        "recorded_sent": sum(e.bytes_sent for e in exchanges),
    }
    return stats, blocked, ratios


def _complete_groups(
    peers_rounds: list[list[RoundRecord]], window_s: float
) -> list[tuple[str, int, str, list[tuple[float, float]]]]:
    """Every group exchange within the window whose members all recorded it, lined up on the
    clock the bench's peers share (`started_unix`) under the group key they share: (tag, group
    size, group key, each member's (start, end)). Exchanges that left a member out are skipped."""
    by_key: dict[str, list[tuple[str, int, float, float]]] = {}
    for rounds in peers_rounds:
        for r in rounds:
            if r.time_s > window_s:
                continue
            for e in r.exchanges:
                if e.ok and e.group and e.started_unix:
                    by_key.setdefault(e.group, []).append(
                        (e.tag, e.group_size, e.started_unix, e.started_unix + e.elapsed_s)
                    )
    out = []
    for key, members in by_key.items():
        tag, g = members[0][0], members[0][1]
        if g < 2 or len(members) != g or any(m[1] != g for m in members):
            continue
        out.append((tag, g, key, [(m[2], m[3]) for m in members]))
    return out


def group_transfer_ratios(
    peers_rounds: list[list[RoundRecord]],
    window_s: float,
    rate_mbit: float,
    num_params: int,
    value_bytes: float = 4.0,
    fragments: list[int] | None = None,
) -> dict[str, list[float]]:
    """Per tag, each complete group exchange's time from its last member's start to its last
    member's result, over bytes / link rate.

    A peer's own `elapsed_s` also counts the wait for members that reached the exchange later
    (compute skew: blocked time, reported as such). Here the exchange is timed from the moment the
    whole group was in it.
    """
    out: dict[str, list[float]] = {}
    for tag, g, key, members in _complete_groups(peers_rounds, window_s):
        span = max(end for _, end in members) - max(start for start, _ in members)
        n = exchanged_params(tag, key, num_params, fragments)
        out.setdefault(tag, []).append(span / bound_s(g, n, rate_mbit, value_bytes))
    return out


def group_start_skew(peers_rounds: list[list[RoundRecord]], window_s: float) -> dict[str, list[float]]:
    """Per tag, each complete group exchange's start skew: its last member's start minus its first
    member's. A blocking exchange's wait brings its members back into phase; an overlapped one
    has no such wait, and the skew is time its early members wait for their result."""
    out: dict[str, list[float]] = {}
    for tag, _, _, members in _complete_groups(peers_rounds, window_s):
        starts = [start for start, _ in members]
        out.setdefault(tag, []).append(max(starts) - min(starts))
    return out


def landing_steps(peers_rounds: list[list[RoundRecord]], window_s: float) -> dict[str, float | None]:
    """Where overlapped exchanges landed (`outer.land_at_step`), over the rounds after the first
    within the window: the mean and 90th percentile inner step of those that landed inside the
    round (None: none did) and their share of the rounds (the others landed at the round's end,
    or ran nothing behind them: 0.0 for a method without overlap; None: no rounds)."""
    rounds = [r for peer in peers_rounds for r in peer if r.time_s <= window_s and r.round > 0]
    steps = [r.landed_at_step for r in rounds if r.landed_at_step is not None]
    return {
        "mean": statistics.fmean(steps) if steps else None,
        "p90": pctl([float(s) for s in steps], 0.9),
        "share_of_rounds": len(steps) / len(rounds) if rounds else None,
    }


def run_stats(
    run_dir: Path,
    run: dict[str, Any],
    peers: int,
    rate_mbit: float,
    budget_s: float,
    num_params: int,
    value_bytes: float = 4.0,
    fragments: list[int] | None = None,
) -> dict[str, Any]:
    """Utilisation, blocking, rounds, bytes (measured and theory), exchange time vs bound, consensus;
    `fragments`: the values of each streamed fragment (`fragment_params`)."""
    per_peer: list[dict[str, Any]] = []
    blocked: list[float] = []
    ratios: dict[str, list[float]] = {}
    peers_rounds: list[list[RoundRecord]] = []
    t0 = run.get("t0_unix")
    for i in range(peers):
        rounds = read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds
        if t0 is not None:  # on the swarm's clock: seconds since its shared start
            rounds = [dataclasses.replace(r, time_s=r.unix_time - t0) for r in rounds]
        peers_rounds.append(rounds)
        stats, b, r = _peer_stats(rounds, budget_s, peers, rate_mbit, num_params, value_bytes, fragments)
        blocked += b
        for tag, v in r.items():
            ratios.setdefault(tag, []).extend(v)
        iface = run["iface"][f"peer{i}"]
        stats["tx_bytes"], stats["rx_bytes"] = iface["tx_bytes"], iface["rx_bytes"]
        stats["tx_payload_bytes"] = iface["tx_bytes"] - HEADER_BYTES_PER_PACKET * iface.get("tx_packets", 0)
        stats["rx_payload_bytes"] = iface["rx_bytes"] - HEADER_BYTES_PER_PACKET * iface.get("rx_packets", 0)
        stats["tcp_retrans_segs"] = iface.get("tcp_retrans_segs")
        per_peer.append(stats)
    rounds_done = min(p["rounds"] for p in per_peer)
    tx = statistics.fmean(p["tx_bytes"] for p in per_peer)
    payload = statistics.fmean(p["tx_payload_bytes"] for p in per_peer)
    theory_ok = statistics.fmean(p["theory_bytes"] for p in per_peer)
    theory = theory_ok + statistics.fmean(p["theory_bytes_failed"] for p in per_peer)
    all_rounds = statistics.fmean(len(rounds) for rounds in peers_rounds)
    return {
        "per_peer": per_peer,
        "rounds_min": rounds_done,
        "rounds_all": all_rounds,
        "utilisation": median([p["utilisation"] for p in per_peer]),
        "step_compute_s": median([p["step_compute_s"] for p in per_peer]),
        "round_time_s": median([p["round_time_s"] for p in per_peer]),
        "blocked_p50_s": pctl(blocked, 0.5),
        "blocked_p95_s": pctl(blocked, 0.95),
        "blocked_max_s": max(blocked) if blocked else None,
        "tx_bytes_per_peer": tx,
        "rx_bytes_per_peer": statistics.fmean(p["rx_bytes"] for p in per_peer),
        "theory_bytes_per_peer": theory,
        "theory_bytes_per_peer_ok_only": theory_ok,
        "wire_bytes_vs_theory": tx / theory if theory else None,
        "tx_payload_bytes_per_peer": payload,
        "wall_s": run.get("window_s", run["wall_s"]),  # the counters' window: launch to the budget
        "bytes_vs_theory": payload / theory if theory else None,
        "tx_bytes_per_peer_per_round": tx / all_rounds if all_rounds else None,
        "exchange_time_vs_bound": {
            tag: {"p50": pctl(v, 0.5), "p95": pctl(v, 0.95)} for tag, v in ratios.items()
        },
        "transfer_time_vs_bound": {
            tag: {"p50": pctl(v, 0.5), "p95": pctl(v, 0.95), "n": len(v)}
            for tag, v in group_transfer_ratios(
                peers_rounds, budget_s, rate_mbit, num_params, value_bytes, fragments
            ).items()
        },
        "start_skew_s": {
            tag: {"p50": pctl(v, 0.5), "p90": pctl(v, 0.9), "n": len(v)}
            for tag, v in group_start_skew(peers_rounds, budget_s).items()
        },
        "landed_at_step": landing_steps(peers_rounds, budget_s),
        "failed_exchanges": sum(p["failed_exchanges"] for p in per_peer),
        "partial_merges": sum(p["partial_merges"] for p in per_peer),
        "exchanges": sum(p["exchanges"] for p in per_peer),
        # what the exchanges' own records say they sent, beside the counters; received bytes come
        # from the counters only (the records' received count repeats the sent one)
        "recorded_sent_per_peer": statistics.fmean(p["recorded_sent"] for p in per_peer),
        "rx_payload_bytes_per_peer": statistics.fmean(p["rx_payload_bytes"] for p in per_peer),
    }


def add_exchange_bytes(runs: list[dict[str, Any]]) -> None:
    """Split each run's payload into control plane and exchange, using the same seed's independent run.

    Every node also moves DHT, heartbeat and p2p housekeeping bytes, whatever its method; the
    independent run moves only those. Their rate (payload bytes per peer per second of the run)
    times a run's wall time is its control plane, and the rest is what its exchanges moved:
    `exchange_bytes_vs_theory` compares that with the butterfly theory. (Measured: ~2% of
    DiLoCo's payload on the --quick model, ~1.7% on the default one.)
    """
    control_rate = {
        r["seed"]: r["stats"]["tx_payload_bytes_per_peer"] / r["stats"]["wall_s"]
        for r in runs
        if r["variant"] == "independent" and r["stats"].get("wall_s")
    }
    for r in runs:
        st = r["stats"]
        theory = st.get("theory_bytes_per_peer")
        if r["seed"] not in control_rate or not theory:
            st["control_bytes_per_peer"] = st["exchange_bytes_vs_theory"] = None
            continue
        control = control_rate[r["seed"]] * st["wall_s"]
        st["control_bytes_per_peer"] = control
        st["exchange_bytes_vs_theory"] = (st["tx_payload_bytes_per_peer"] - control) / theory
