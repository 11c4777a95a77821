"""Per-method timing models. Each takes the sampled `SampledSwarm` and returns a `MethodResult`.

Units that stop together on a failure: the whole job for data-parallel, one peer (learner) for the
DiLoCo family (a peer runs synchronous data parallelism inside and re-forms in `reconfig_s` after
dropping a failed slice). Rounds are simulated one at a time, vectorised over peers:

- sync_dp: one SPMD job; every failure stops it for `restart_s` and rewinds it to its last
  checkpoint. Failed slices are swapped from a spare pool at restart (capacity stays full). Each
  step waits for the slowest peer and for a gradient all-reduce over the peer links.
- elastic_dp: as sync_dp, but a failure only pauses the job for `reconfig_s` (drop the slice,
  re-form) and loses the in-flight step; the job runs without the slice until it is repaired.
- diloco (docs/algorithms.md §1): H inner steps per peer, then a blocking global all-reduce; a round
  waits for the slowest (or paused) peer.
- decoupled (§4): learners never wait for each other; the syncer merges once a quorum has
  contributed, plus an adaptive grace window; late learners are merged in the next round.
- noloco (§2): after H steps each peer averages with a random group (seeded permutation per round);
  a group waits for its slowest member.
- gossip (§3): Mix1 (group average of anchors) overlaps the H steps; if late, a peer waits at most
  the grace window and then drops it; every `mix2_every` a blocking Mix2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from p2p_trainer.lab.sim import latency
from p2p_trainer.lab.sim.events import FloatArray, IntArray, Pauses, Repairs, derived_rng
from p2p_trainer.lab.sim.sampled import NUM_BINS, Ledger, SampledSwarm
from p2p_trainer.lab.sim.scenario import Scenario


@dataclass(frozen=True)
class MethodResult:
    """Totals over the horizon plus the goodput series (NUM_BINS equal time bins)."""

    method: str
    goodput: float
    """Useful work / work the hardware could have done at its own speeds (sampled.py)."""
    utilisation: float
    """Fraction of chip-time spent in steps."""
    uptime: float
    """Fraction of time at least one unit makes progress."""
    mean_round_s: float
    """Mean outer-round time (one step for data-parallel)."""
    rounds: int
    bytes_per_peer_per_round: float
    """Bytes one peer sends per outer round (per step for data-parallel)."""
    bytes_per_peer_total: float
    """Bytes one peer sends over the horizon."""
    extra: dict[str, float] = field(default_factory=dict)
    series_goodput: list[float] = field(default_factory=list)
    round_trace: list[tuple[float, float]] = field(default_factory=list)
    """(start time s, mean duration s) per outer round; empty for data-parallel."""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def method_result(name: str, ledger: Ledger, uptime: float, nbytes: float, **extra: float) -> MethodResult:
    t = ledger.totals()
    return MethodResult(
        name,
        t["goodput"],
        t["utilisation"],
        uptime,
        t["mean_round_s"],
        int(t["rounds"]),
        nbytes,
        nbytes * t["rounds"],
        extra,
        [float(x) for x in ledger.series_goodput()],
        ledger.round_trace,
    )


def _data_parallel(
    sw: SampledSwarm, name: str, pause_s: float, lost_s: FloatArray, spares: bool
) -> MethodResult:
    s = sw.scenario
    n = s.num_chips
    job = np.zeros(len(sw.failures), dtype=np.int64)
    pauses = Pauses.from_failures(job, sw.failures.time_s, lost_s, pause_s, 1)
    repairs = Repairs(job, sw.failures.time_s, 0.0 if spares else s.repair_s, s.chips_per_slice, 1)
    # A synchronous step waits for the slowest peer and an all-reduce of the gradients.
    comm_s = latency.allreduce_s(
        s.allreduce, s.num_peers, s.exchange_bytes, float(sw.bandwidth_Bps.min()), float(sw.alpha_s.max())
    )
    step_wall_s = s.step_s * float(sw.speed.max()) + comm_s + s.round_overhead_s
    edges = np.linspace(0.0, s.horizon_s, NUM_BINS + 1)
    zeros = np.zeros(NUM_BINS + 1, dtype=np.int64)
    running = np.diff(pauses.running_until(zeros, edges))
    live = repairs.live_fraction(zeros[:-1], edges[:-1], edges[1:], n)
    ledger = Ledger(sw, pauses, repairs)
    useful = running * live * n * s.step_s / step_wall_s
    ledger.useful_chip_s = float(useful.sum())
    ledger.compute_chip_s = float((running * live * n * s.step_s * sw.speed.mean() / step_wall_s).sum())
    ledger.series_chip_s = useful
    steps = int(running.sum() / step_wall_s)
    ledger.round_sum_s, ledger.round_count, ledger.outer_rounds = steps * step_wall_s, steps, steps
    nbytes = latency.allreduce_bytes_per_peer(s.allreduce, s.num_peers, s.exchange_bytes)
    uptime = float(running.sum()) / s.horizon_s
    return method_result(name, ledger, uptime, nbytes, step_wall_s=step_wall_s)


def sync_dp(sw: SampledSwarm) -> MethodResult:
    s = sw.scenario
    lost = sw.lost_work_s(s.checkpoint_interval_s)
    return _data_parallel(sw, "sync_dp", s.restart_s, lost, spares=True)


def elastic_dp(sw: SampledSwarm) -> MethodResult:
    s = sw.scenario
    return _data_parallel(sw, "elastic_dp", s.reconfig_s, sw.lost_work_s(s.step_s), spares=False)


@dataclass
class RoundState:
    """Shared state of the round-based methods."""

    sw: SampledSwarm
    pauses: Pauses
    ledger: Ledger
    peers: IntArray
    work_s: FloatArray
    draws: int = 0
    """Rounds of per-peer jitter drawn so far (each from its own derived stream)."""

    @classmethod
    def start(cls, sw: SampledSwarm) -> RoundState:
        s = sw.scenario
        pauses, repairs = sw.peer_pauses(), sw.peer_repairs()
        peers = np.arange(s.num_peers, dtype=np.int64)
        return cls(sw, pauses, Ledger(sw, pauses, repairs), peers, s.num_inner_steps * s.step_s * sw.speed)

    def compute(
        self, start_s: FloatArray, peers: IntArray | None = None, slowdown_s: float = 0.0
    ) -> FloatArray:
        """Run H inner steps from `start_s` on `peers` (default: every peer); return the finish times.

        `slowdown_s`: step time lost to a background exchange (`overlap_cpu_s_per_mb`): spent in
        steps (utilisation) but not training (goodput)."""
        peers = self.peers if peers is None else peers
        work = self.work_s[peers] + slowdown_s
        s = self.sw.scenario
        if s.round_jitter_sigma > 0:
            work = work * np.exp(
                derived_rng(s.seed, 14, self.draws).normal(0.0, s.round_jitter_sigma, len(peers))
            )
            self.draws += 1
        finish = self.pauses.finish_time(peers, start_s, work)
        active = start_s < self.sw.scenario.horizon_s
        share = float(self.work_s.mean() / (self.work_s.mean() + slowdown_s))
        self.ledger.add_compute(peers[active], start_s[active], finish[active], work[active], share)
        return finish

    def uptime(self, blocked_all_s: float = 0.0) -> float:
        h = self.sw.scenario.horizon_s
        return max(0.0, 1.0 - (self.pauses.all_down_s(h) + blocked_all_s) / h)


def diloco(sw: SampledSwarm) -> MethodResult:
    s = sw.scenario
    r = RoundState.start(sw)
    comm_s = s.exchange_overhead_s + latency.allreduce_s(
        s.allreduce, s.num_peers, s.exchange_bytes, float(sw.bandwidth_Bps.min()), float(sw.alpha_s.max())
    )
    t, blocked = 0.0, 0.0
    while t < s.horizon_s:
        finish = r.compute(np.full(s.num_peers, t))
        end = float(finish.max()) + comm_s
        blocked += min(end, s.horizon_s) - min(float(finish.max()), s.horizon_s)
        end += s.round_overhead_s
        r.ledger.add_round(t, np.array([end - t]))
        t = end
    nbytes = latency.allreduce_bytes_per_peer(s.allreduce, s.num_peers, s.exchange_bytes)
    return method_result("diloco", r.ledger, r.uptime(blocked), nbytes, allreduce_s=comm_s)


def _groups(num_peers: int, group_size: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
    """A random partition into groups of `group_size` (the remainder joins the last group).

    Returns (perm, starts): group k is perm[starts[k]:starts[k+1]].
    """
    perm = rng.permutation(num_peers).astype(np.int64)
    count = max(num_peers // group_size, 1)
    starts = np.arange(count, dtype=np.int64) * group_size
    return perm, starts


def _group_exchange(
    sw: SampledSwarm, ready_s: FloatArray, group_size: int, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray]:
    """Each random group waits for its last member, then averages. Returns (done_s, exchange_s) per peer."""
    s = sw.scenario
    perm, starts = _groups(s.num_peers, group_size, rng)
    sizes = np.diff(np.append(starts, s.num_peers))
    ready = np.maximum.reduceat(ready_s[perm], starts)
    bw = np.minimum.reduceat(sw.bandwidth_Bps[perm], starts)
    alpha = np.maximum.reduceat(sw.alpha_s[perm], starts)
    exchange = s.exchange_overhead_s + latency.group_average_s(sizes, s.exchange_bytes, bw, alpha)
    done = np.empty(s.num_peers)
    took = np.empty(s.num_peers)
    done[perm] = np.repeat(ready + exchange, sizes)
    took[perm] = np.repeat(exchange, sizes)
    return done, took


def noloco(sw: SampledSwarm) -> MethodResult:
    s = sw.scenario
    r = RoundState.start(sw)
    t = np.zeros(s.num_peers)
    rnd = 0
    while t.min() < s.horizon_s:
        finish = r.compute(t)
        nxt, _ = _group_exchange(sw, finish, s.group_size, derived_rng(s.seed, 10, rnd))
        nxt = nxt + s.round_overhead_s
        r.ledger.add_round(float(t.mean()), (nxt - t)[t < s.horizon_s])
        t, rnd = nxt, rnd + 1
    nbytes = latency.group_bytes_per_peer(s.group_size, s.exchange_bytes)
    return method_result("noloco", r.ledger, r.uptime(), nbytes)


def gossip(sw: SampledSwarm) -> MethodResult:
    s = sw.scenario
    r = RoundState.start(sw)
    grace_s = min(s.grace_max_s, s.grace_gamma * s.grace_overlap_steps * s.step_s)
    allreduce = s.exchange_overhead_s + latency.allreduce_s(
        s.allreduce, s.num_peers, s.exchange_bytes, float(sw.bandwidth_Bps.min()), float(sw.alpha_s.max())
    )
    t = np.zeros(s.num_peers)
    rnd, dropped, blocked_all = 0, 0, 0.0
    mix1_bytes = latency.group_bytes_per_peer(s.group_size, s.exchange_bytes)
    slowdown_s = s.overlap_cpu_s_per_mb * mix1_bytes / 1e6
    while t.min() < s.horizon_s:
        finish = r.compute(t, slowdown_s=slowdown_s)
        # Mix1 starts with the round and overlaps compute (anchors are fixed during the round).
        _, mix1_s = _group_exchange(sw, t, s.group_size, derived_rng(s.seed, 11, rnd))
        mix1_done = t + mix1_s
        late = mix1_done > finish + grace_s
        dropped += int(late.sum())
        ready = np.where(late, finish + grace_s, np.maximum(finish, mix1_done))
        nxt = ready
        if s.mix2_every and (rnd + 1) % s.mix2_every == 0:
            if s.mix2_group_size == 0:
                nxt = np.full(s.num_peers, ready.max() + allreduce)
                blocked_all += allreduce
            else:
                nxt, _ = _group_exchange(sw, ready, s.mix2_group_size, derived_rng(s.seed, 12, rnd))
        nxt = nxt + s.round_overhead_s
        r.ledger.add_round(float(t.mean()), (nxt - t)[t < s.horizon_s])
        t, rnd = nxt, rnd + 1
    mix2_bytes = (
        latency.allreduce_bytes_per_peer(s.allreduce, s.num_peers, s.exchange_bytes)
        if s.mix2_group_size == 0
        else latency.group_bytes_per_peer(s.mix2_group_size, s.exchange_bytes)
    )
    per_round = latency.group_bytes_per_peer(s.group_size, s.exchange_bytes)
    if s.mix2_every:
        per_round += mix2_bytes / s.mix2_every
    extra = {"mix1_dropped_fraction": dropped / max(rnd * s.num_peers, 1)}
    return method_result("gossip", r.ledger, r.uptime(blocked_all), per_round, **extra)


def quorum_size(s: Scenario) -> int:
    return max(1, math.ceil(s.quorum_fraction * s.num_peers - 1e-9))
