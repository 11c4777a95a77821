"""One peer's training: inner steps (AdamW) and its method's exchange and outer step.

`Peer.run_round_until` is the whole algorithm on one screen; everything else here is set-up,
evaluation and bookkeeping. The peer knows nothing about the network: it is handed an `Exchange`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from p2p_trainer.algo.methods import OuterState, RoundReport, build_method, grace_tracker
from p2p_trainer.algo.work import WorkQuota
from p2p_trainer.config import RunConfig
from p2p_trainer.exchange.interface import Exchange
from p2p_trainer.fault_points import NO_FAULTS, FaultInjector
from p2p_trainer.heap import keep_freed_memory
from p2p_trainer.train.compiled import compile_forward
from p2p_trainer.train.data import Corpus
from p2p_trainer.train.host_state import HostMirror, OuterMemory, offloads
from p2p_trainer.train.workload import Workload, language_model, to_device

logger = logging.getLogger(__name__)
FUSED_ADAMW_DEVICES = ("cpu", "cuda")
"""Devices where torch has a fused AdamW kernel; elsewhere the optimizer loops over the tensors."""


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine down to `min_ratio` at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class RoundMetrics:
    """What one round did; the trainer's single source of metrics."""

    round: int
    step: int
    tokens: int
    train_loss: float
    compute_s: float
    blocked_s: float
    wall_s: float
    report: RoundReport
    val_loss: float | None = None
    round_tokens: int = 0
    """Tokens of this round (§6: a constant-work round tops up when peers left)."""
    live_peers: int = 1
    """Training peers this one counted when it sized its share (itself included)."""
    skipped_steps: int = 0
    """Inner steps this round left out (the peer adopted a state mid-round, or had done them
    before it stopped mid-round and was resumed)."""
    landed_at_step: int | None = None
    """Inner steps of this round done when the exchange running behind it was applied
    (`outer.land_at_step`); None: at the round's end, or none ran (or it landed before a
    mid-round stop, in the part of the round run before the stop)."""

    @property
    def merged_with(self) -> int:
        """Peers whose values reached this round's largest merged exchange, this one included
        (1: it merged with no one)."""
        return max((max(2, e.group_size) for e in self.report.exchanges if e.merged), default=1)


class Peer:
    def __init__(
        self,
        cfg: RunConfig,
        exchange: Exchange,
        corpus: Corpus | None = None,
        peer_key: str = "",
        device: str = "cpu",
        live_peers: Callable[[], list[str]] | None = None,
        self_id: str | None = None,
        faults: FaultInjector = NO_FAULTS,
        workload: Workload | None = None,
    ) -> None:
        """Trains `workload`, or without one the config's model on `corpus` (the data stream
        `peer_key`). `live_peers` (ids of the live peers) sizes this peer's share of a
        constant-work round (§6); `faults` is told when the round's inner steps are half done
        (fault point "inner")."""
        self.cfg, self.exchange, self.device = cfg, exchange, torch.device(device)
        self.faults = faults
        inner_step_settings(cfg, self.device)
        if workload is None:
            if corpus is None:
                raise ValueError("a Peer needs a corpus or a workload")
            workload = language_model(cfg, corpus, peer_key)
        self.workload = workload
        self.model = workload.model.to(self.device)
        # the inner steps' forward; `model` stays the module itself, whose names checkpoints keep
        self.forward_model = compile_forward(self.model, self.device) if cfg.inner.compile else self.model
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.params: list[torch.Tensor] = [p for _, p in named]
        inner = cfg.inner
        self.optimizer: torch.optim.Optimizer = workload.optimizer or torch.optim.AdamW(
            self.params,
            lr=inner.lr,
            betas=inner.betas,
            weight_decay=inner.weight_decay,
            # one fused kernel instead of a Python loop over the tensors: on the CPU a 23.5M-parameter
            # step takes 50 ms instead of 195 ms (7 % of a 2.2 s inner step), on a GPU it saves launches
            fused=self.device.type in FUSED_ADAMW_DEVICES,
        )
        self.lr_schedule = workload.lr_schedule or (
            lambda s: lr_factor(s, inner.warmup_steps, cfg.total_inner_steps, inner.min_lr_ratio)
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_schedule)
        self.stream = workload.batches
        self.val = workload.val_batches
        self.timing = grace_tracker(cfg.exchange)  # §4: step-time EMA feeds the grace window
        # §10: one full round's tokens, the most an honest partner's weight needs (a survivor's §6
        # top-up included)
        full = cfg.outer.num_inner_steps * cfg.inner.grad_accum * workload.tokens_per_batch
        round_tokens = float(max(full, cfg.outer.target_tokens_per_round))
        names = [n for n, _ in named]
        self.method = build_method(cfg.outer, exchange, self.timing, cfg.exchange, round_tokens, names)
        self.mirror = HostMirror(self.params, offloads(cfg.outer.offload, self.device))
        self.state = OuterState.from_params(self.mirror.pull())
        self.step = 0
        self.skip_steps = 0
        """Inner steps the next round leaves out: a peer that adopted a donor's state mid-round
        (late join, rejoin) ends its first round with the donor instead of a part-round later, and
        a peer stopped mid-round (`run_round_until`) has done them already."""
        self.round_step = 0
        """Inner steps done in the round in progress (H while it exchanges), for progress reports."""
        self.work_done = 0
        """Micro-batches of this round's work quota (§6) already done by a peer stopped mid-round,
        so that its resumed round does not do them again."""
        self.tokens = 0
        self.tokens_since_merge = 0
        self.anchor_tokens = 0
        """Tokens of the round that produced the current anchor φ: Mix1's weight (§5), since Mix1
        averages anchors at the start of the next round, after this round's count was reset."""
        # the work split is among swarm ids (peer ids), which the data key need not be
        self.work = WorkQuota(cfg, self_id or peer_key, live_peers)

    # --------------------------------------------------------------------------- the algorithm
    def run_round(self) -> RoundMetrics:
        """One whole round: inner steps, then the method's exchange and outer step."""
        m = self.run_round_until(_never)
        assert m is not None  # nothing asked it to stop
        return m

    def run_round_until(self, should_stop: Callable[[], bool]) -> RoundMetrics | None:
        """One round, unless `should_stop()` (asked before every inner step) says stop first.

        A stopped round ends before its exchange and outer step, as if the peer had left there,
        and returns None: φ and the round are those of the last completed round, θ and the
        optimizer hold the steps done, and `skip_steps` says how many, so a checkpoint taken now
        resumes the round where it stopped.
        """
        t_round = time.monotonic()
        report = RoundReport(self.state.round)
        self.method.begin_round(self.state, float(max(1, self.anchor_tokens)))  # factored: Mix1 starts here
        tokens_before = self.tokens
        self.work.begin_round(done=self.work_done)
        losses = []
        first, self.skip_steps, self.work_done = self.skip_steps, 0, 0
        self.round_step = first
        landed_at: int | None = None
        for s in range(first, self.cfg.outer.num_inner_steps):
            if should_stop():
                self.skip_steps, self.work_done = s, self.work.done
                logger.info("stopped in round %d after %d of its inner steps", self.state.round, s)
                return None
            if s == self.cfg.outer.num_inner_steps // 2:
                self.faults.reached("inner", self.state.round)
            losses.append(self.inner_step(report, self.work.next_step(s)))  # §6: tops up if peers left
            self.round_step = s + 1
            land_at = self.cfg.outer.land_at_step
            if land_at and self.round_step >= land_at and self.method.ready_to_land(self.state):
                self._land(report)
                # after the round's last step the landing is the round's end's, recorded as such
                landed_at = self.round_step if self.round_step < self.cfg.outer.num_inner_steps else None
        compute_s = time.monotonic() - t_round - report.blocked_s
        fast = self.mirror.pull()  # θ where φ lives: on the host with offload
        self.method.end_round(fast, self.state, self._merge_weight(), report)  # exchange + outer step
        self.mirror.push()
        self.round_step = 0  # the round advanced: none of the next round's steps are done
        self.anchor_tokens, self.tokens_since_merge = self.tokens_since_merge, 0
        m = RoundMetrics(
            round=self.state.round - 1,
            step=self.step,
            tokens=self.tokens,
            train_loss=float(torch.stack(losses).mean()),
            compute_s=compute_s,
            blocked_s=report.blocked_s,
            wall_s=time.monotonic() - t_round,
            report=report,
            round_tokens=self.tokens - tokens_before,
            live_peers=self.work.live,
            skipped_steps=first,
            landed_at_step=landed_at,
        )
        if (
            self.val
            and self.cfg.inner.eval_every
            and self.step % self.cfg.inner.eval_every < self.cfg.outer.num_inner_steps
        ):
            m.val_loss = self.evaluate()
        return m

    def inner_step(self, report: RoundReport, micro_batches: int | None = None) -> torch.Tensor:
        """One AdamW step over `micro_batches` (default `grad_accum`); returns the mean loss (a tensor)."""
        inner = self.cfg.inner
        t0, blocked0 = time.monotonic(), report.blocked_s
        accum = micro_batches or inner.grad_accum
        total = torch.zeros((), device=self.device)
        tokens = self.workload.tokens_per_batch
        for _ in range(accum):
            batch = to_device(self.stream.next_batch(), self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=inner.bf16):
                loss = self.workload.loss_fn(self.forward_model, batch) / accum
            loss.backward()
            total += loss.detach()
            self.tokens += tokens
            self.tokens_since_merge += tokens
        grads = [p.grad for p in self.params if p.grad is not None]
        self.method.sync_gradients(grads, self.step, report)  # data-parallel only
        if inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, inner.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.timing.observe_step(time.monotonic() - t0 - (report.blocked_s - blocked0))
        return total

    # --------------------------------------------------------------------------- helpers
    def _land(self, report: RoundReport) -> None:
        """The exchange running behind this round, applied now (`outer.land_at_step`): at the
        first inner step from that one on where its result is in, so a late partner holds up
        nobody's steps; at the round's end at the latest."""
        fast = self.mirror.pull()
        if self.method.land(fast, self.state, report):
            self.mirror.push()

    def outer_memory(self) -> OuterMemory:
        """What the outer state adds to the model's own memory (φ, m, θ's staging copy), and where."""
        return self.mirror.memory(self.state)

    def _merge_weight(self) -> float:
        """§5: this round's tokens, the work behind its Δ and θ (at least one, so a fresh peer counts)."""
        return float(max(1, self.tokens_since_merge))

    @torch.no_grad()
    def evaluate(self, params: list[torch.Tensor] | None = None) -> float:
        """Mean validation loss (for our language models in nats per token, = nats/byte for byte
        tokens); `params` instead of the model's own, for the call. Needs validation batches."""
        if not self.val:
            raise ValueError("this peer has no validation batches to evaluate on")
        self.model.eval()
        saved = None
        if params is not None:
            saved = [p.detach().clone() for p in self.params]
            for p, v in zip(self.params, params, strict=True):
                p.copy_(v)
        try:
            losses = []
            for batch in self.val:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.inner.bf16):
                    losses.append(float(self.workload.loss_fn(self.model, to_device(batch, self.device))))
            return sum(losses) / len(losses)
        finally:
            if saved is not None:
                for p, v in zip(self.params, saved, strict=True):
                    p.copy_(v)
            self.model.train()

    def train(self, rounds: int) -> list[RoundMetrics]:
        return [self.run_round() for _ in range(rounds)]


def _never() -> bool:
    return False


def inner_step_settings(cfg: RunConfig, device: torch.device) -> None:
    """The process and thread settings inner steps run with; call on the thread that trains."""
    keep_freed_memory()  # a step's activations are reused, not faulted in afresh each step
    if device.type == "cpu" and cfg.inner.flush_denormal:
        torch.set_flush_denormal(True)  # this thread's (InnerConfig)


def adopt_state(peer: Peer, state: OuterState, skip_steps: int = 0) -> None:
    """Take over a downloaded outer state (late join): θ ← φ, and the schedule moves to its round.

    `skip_steps` (0 … H−1) are the round's inner steps the donor had done by the time the state
    arrived: this peer leaves them out of its first round, so it reaches that round's exchange with
    its group instead of after it (its token weight, §5, counts the shorter round less).
    """
    h = peer.cfg.outer.num_inner_steps
    if not 0 <= skip_steps < h:
        raise ValueError(f"skip_steps={skip_steps}: must be in [0, {h})")
    where = peer.mirror.state_device  # a downloaded state arrives on the CPU
    state.anchor = [a.to(where, torch.float32) for a in state.anchor]
    state.momentum = [m.to(where, torch.float32) for m in state.momentum]
    peer.state = state
    with torch.no_grad():
        for p, a in zip(peer.params, state.anchor, strict=True):
            p.copy_(a)
    peer.skip_steps, peer.work_done = skip_steps, 0
    peer.round_step = skip_steps
    peer.step = state.round * h + skip_steps
    peer.scheduler.last_epoch = peer.step
    factor = peer.lr_schedule(peer.step)
    for group, base in zip(peer.optimizer.param_groups, peer.scheduler.base_lrs, strict=True):
        group["lr"] = base * factor
