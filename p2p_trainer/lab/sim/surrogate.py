"""Optimisation surrogate: per-peer noisy quadratics, so time and quality are seen together.

Peer i minimises f_i(x) = ½ Σ_k h_k (x_k − c_ik)² with its own optimum c_i = c + heterogeneity and
noisy gradients (SGD, noise σ). The swarm's objective is the mean of the f_i. Each method's outer
step follows docs/algorithms.md (§1 DiLoCo, §2 NoLoCo, §3 factored gossip; Decoupled DiLoCo merges only
the contributors of a round). A method runs as many outer rounds as the timing simulation says it
completed within the horizon (scaled down by one common factor to stay cheap), so a method that is
faster in time gets more optimisation. Only `num_peers` up to MAX_PEERS peers are simulated here.

Reported: excess loss f(φ̄) − f* at the end and consensus distance mean‖φ_i − φ̄‖ / ‖φ̄‖ (for
Decoupled DiLoCo, the spread of the learners' fast weights around their mean; φ is global).
A Decoupled DiLoCo "round" here is one syncer merge: each merge advances every learner by the
contributing share of a round, so learners do the same work per unit time as in the timing model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from p2p_trainer.lab.sim.events import FloatArray, derived_rng
from p2p_trainer.lab.sim.scenario import Scenario
from p2p_trainer.lab.sim.timing import MethodResult

MAX_PEERS = 32
DIM = 64
INNER_STEPS = 10
"""Surrogate inner steps per outer round (stands for the scenario's H)."""
MAX_ROUNDS = 200
"""Rounds given to the fastest method; the others get proportionally fewer."""
LR = 0.05
NOISE = 0.5
HETEROGENEITY = 1.0


@dataclass(frozen=True)
class SurrogateResult:
    method: str
    rounds: int
    excess_loss: float
    consensus_distance: float
    loss_trace: list[float]


@dataclass
class _Problem:
    h: FloatArray
    c: FloatArray  # (P, D) per-peer optima
    rng: np.random.Generator

    def excess_loss(self, x: FloatArray) -> float:
        opt = self.c.mean(axis=0)
        return float(0.5 * np.sum(self.h * (x - opt) ** 2))

    def inner(self, theta: FloatArray, steps: int) -> FloatArray:
        for _ in range(steps):
            grad = self.h * (theta - self.c) + NOISE * self.rng.standard_normal(theta.shape)
            theta = theta - LR * grad
        return theta


def _group_mean(x: FloatArray, group_size: int, rng: np.random.Generator) -> FloatArray:
    """Mean over a random partition into groups of `group_size` (remainder joins the last group)."""
    p = len(x)
    perm = rng.permutation(p)
    gid = np.minimum(np.arange(p) // group_size, max(p // group_size, 1) - 1)
    sums = np.zeros((gid.max() + 1, x.shape[1]))
    np.add.at(sums, gid, x[perm])
    out = np.empty_like(x)
    out[perm] = (sums / np.bincount(gid)[:, None])[gid]
    return out


def _nesterov(phi_hat: FloatArray, delta: FloatArray, m: FloatArray) -> tuple[FloatArray, FloatArray]:
    """docs/algorithms.md §1/§3: m ← β m + Δ; φ ← φ̂ − α (Δ + β m), α = 0.7, β = 0.9."""
    m = 0.9 * m + delta
    return phi_hat - 0.7 * (delta + 0.9 * m), m


def _outer_round(
    method: str, phi: FloatArray, m: FloatArray, prob: _Problem, s: Scenario, rnd: int
) -> tuple[FloatArray, FloatArray]:
    """One outer round of `method` on all surrogate peers; returns the new (φ, m)."""
    p = len(phi)
    groups = derived_rng(s.seed, 20, rnd)
    if method in ("sync_dp", "elastic_dp"):  # one model, gradients averaged every step
        x = phi[0]
        for _ in range(INNER_STEPS):
            noise = NOISE * prob.rng.standard_normal(x.shape) / np.sqrt(p)
            x = x - LR * (prob.h * (x - prob.c.mean(axis=0)) + noise)
        return np.broadcast_to(x, phi.shape).copy(), m
    theta = prob.inner(phi, INNER_STEPS)
    if method == "diloco":
        return _nesterov(phi, np.broadcast_to((phi - theta).mean(axis=0), phi.shape), m)
    if method == "noloco":  # §2 with γ = α: m ← β m + α (mean_G(θ) − φ); φ ← φ + m
        m = 0.5 * m + 0.7 * (_group_mean(theta, s.group_size, groups) - phi)
        return phi + m, m
    # gossip, §3: Mix1 on anchors, Mix2 on pseudo-gradients every mix2_every
    phi_hat = _group_mean(phi, s.group_size, groups)
    delta = phi - theta
    if s.mix2_every and (rnd + 1) % s.mix2_every == 0:
        if s.mix2_group_size == 0:
            delta = np.broadcast_to(delta.mean(axis=0), delta.shape)
        else:
            delta = _group_mean(delta, s.mix2_group_size, derived_rng(s.seed, 21, rnd))
    return _nesterov(phi_hat, delta, m)


@dataclass
class _Learners:
    """Decoupled DiLoCo learners: own anchors and fast weights; the syncer holds the global φ and m."""

    anchor: FloatArray
    theta: FloatArray
    phi: FloatArray
    m: FloatArray

    def merge(self, prob: _Problem, share: float, rng: np.random.Generator) -> None:
        """One syncer merge. Every learner advances `share` of a round; a random `share` of them
        (those at the end of their round) contribute Δ_i = anchor_i − θ_i and restart from the new φ;
        the others keep stepping from where they are and contribute at a later merge. The merged
        pseudo-gradient is weighted by the contributors' share of a full round's tokens (§5)."""
        p = len(self.theta)
        self.theta = prob.inner(self.theta, max(1, round(INNER_STEPS * share)))
        who = rng.choice(p, size=max(1, round(share * p)), replace=False)
        # Token weighting: the contributors carry `share` of a full round's tokens.
        delta = share * (self.anchor[who] - self.theta[who]).mean(axis=0)
        phi, self.m = _nesterov(self.phi[None, :], delta[None, :], self.m)
        self.phi = phi[0]
        self.anchor[who] = self.phi
        self.theta[who] = self.phi


def _rounds_done(r: MethodResult, s: Scenario) -> float:
    """Outer rounds completed in the horizon (data-parallel: steps / H)."""
    return r.rounds / s.num_inner_steps if r.method in ("sync_dp", "elastic_dp") else float(r.rounds)


def consensus_distance(phi: FloatArray) -> float:
    """mean ‖φ_i − φ̄‖ / ‖φ̄‖ (docs/algorithms.md §8)."""
    mean = phi.mean(axis=0)
    return float(np.linalg.norm(phi - mean, axis=1).mean() / max(np.linalg.norm(mean), 1e-12))


def run_surrogate(s: Scenario, results: Mapping[str, MethodResult]) -> dict[str, SurrogateResult]:
    """Optimise the same quadratic with every simulated method for its share of rounds."""
    done = {name: _rounds_done(r, s) for name, r in results.items()}
    scale = MAX_ROUNDS / max(max(done.values()), 1e-9)
    p = min(s.num_peers, MAX_PEERS)
    out = {}
    for name, r in results.items():
        rng = derived_rng(s.seed, 22)
        h = np.geomspace(0.1, 1.0, DIM)
        c = 1.0 + HETEROGENEITY * rng.standard_normal((p, DIM))
        prob = _Problem(h, c, rng)
        phi, m = np.zeros((p, DIM)), np.zeros((p, DIM))
        share = r.extra.get("mean_contributors", s.num_peers) / s.num_peers
        rounds = round(float(done[name] * scale))
        trace = [prob.excess_loss(phi.mean(axis=0))]
        learners = _Learners(phi.copy(), phi.copy(), phi[0].copy(), np.zeros((1, DIM)))
        for rnd in range(rounds):
            if name == "decoupled":
                learners.merge(prob, share, derived_rng(s.seed, 23, rnd))
                phi = np.broadcast_to(learners.phi, phi.shape)
            else:
                phi, m = _outer_round(name, phi, m, prob, s, rnd)
            trace.append(prob.excess_loss(phi.mean(axis=0)))
        spread = learners.theta if name == "decoupled" else phi
        out[name] = SurrogateResult(name, rounds, trace[-1], consensus_distance(spread), trace)
    return out
