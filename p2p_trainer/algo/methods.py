"""One strategy object per outer method, chosen once at construction (`build_method`).

A strategy owns the method's exchanges and calls the pure math in `outer.py`. The trainer calls
`begin_round` before the inner steps, `sync_gradients` after each backward pass, and `end_round`
after the inner steps; no method flags are tested inside the loop. A failed exchange is recorded
and the peer continues with its own tensors (the "group of one").

Each exchange names its reference (§10), what a partner's values are measured against: zero for
updates (DiLoCo's and Mix2's Δ, gradients), and for models the tensors this peer held before the
round's training: φ for NoLoCo's θ, the previous round's anchor for Mix1's and re-agreement's
anchors (at round 0 the anchors themselves, which every peer starts from).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from p2p_trainer.algo import outer
from p2p_trainer.algo.grace import GraceTracker
from p2p_trainer.config import ExchangeConfig, OuterConfig
from p2p_trainer.exchange.codecs import from_config
from p2p_trainer.exchange.feedback import ErrorFeedback
from p2p_trainer.exchange.interface import (
    ALL,
    ZERO,
    Exchange,
    ExchangeRequest,
    ExchangeResult,
    Ok,
    PendingExchange,
)
from p2p_trainer.round_log import ExchangeRecord

logger = logging.getLogger(__name__)


@dataclass
class OuterState:
    """φ (anchor), m (outer momentum) and the outer round: what a late joiner downloads."""

    anchor: list[torch.Tensor]
    momentum: list[torch.Tensor]
    round: int = 0

    @classmethod
    def from_params(cls, params: list[torch.Tensor]) -> OuterState:
        anchor = [p.detach().float().clone() for p in params]
        return cls(anchor=anchor, momentum=[torch.zeros_like(a) for a in anchor])


@dataclass
class RoundReport:
    """The exchanges of the round in progress, recorded as they finish (the round's record takes them)."""

    round: int
    exchanges: list[ExchangeRecord] = field(default_factory=list)

    @property
    def blocked_s(self) -> float:
        return sum(e.blocked_s for e in self.exchanges)

    def add(self, tag: str, res: ExchangeResult, blocked_s: float) -> ExchangeResult:
        if isinstance(res, Ok):
            rec = ExchangeRecord(
                tag,
                True,
                res.group_size,
                res.elapsed_s,
                blocked_s,
                bytes_sent=res.bytes_sent,
                bytes_received=res.bytes_received,
                left_out=res.left_out,
                own_parts=res.own_parts,
                late_parts=res.late_parts,
                started_unix=res.started_unix,
                group=res.group_key,
            )
            if res.left_out:
                logger.info("round %d: %s left out %s", self.round, tag, ", ".join(res.left_out))
        else:
            logger.info("round %d: %s exchange failed (%s); keeping own tensors", self.round, tag, res.reason)
            rec = ExchangeRecord(tag, False, 1, res.elapsed_s, blocked_s, reason=res.reason)
        self.exchanges.append(rec)
        return res


def copy_into(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """θ ← values, in place, keeping each parameter's dtype and device."""
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)


class OuterMethod(Protocol):
    def begin_round(self, state: OuterState, weight: float) -> None: ...

    def sync_gradients(self, grads: list[torch.Tensor], step: int, report: RoundReport) -> None: ...

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        """Exchange, outer step, θ ← φ; advances `state.round`."""
        ...

    def ready_to_land(self, state: OuterState) -> bool:
        """Whether an exchange running behind this round has its result, to apply now."""
        ...

    def land(self, params: list[torch.Tensor], state: OuterState, report: RoundReport) -> bool:
        """Apply an exchange running behind this round now (`outer.land_at_step`); returns
        whether φ and θ (`params`) changed."""
        ...


class _NoGradientSync:
    def sync_gradients(self, grads: list[torch.Tensor], step: int, report: RoundReport) -> None:
        return None

    def ready_to_land(self, state: OuterState) -> bool:
        return False

    def land(self, params: list[torch.Tensor], state: OuterState, report: RoundReport) -> bool:
        return False


def grace_tracker(cfg: ExchangeConfig) -> GraceTracker:
    """The §4 timing state of one peer, from its exchange config."""
    return GraceTracker(
        cfg.grace_overlap_steps, cfg.grace_gamma, cfg.grace_min_s, cfg.grace_max_s, cfg.grace_margin
    )


class _BlockingExchanges:
    """Shared by the methods: one timed, recorded exchange with a quorum and grace window (§4)."""

    TOKEN_WEIGHTS = True
    """Whether the exchanges weigh by tokens where `token_weighted` is on (§5)."""

    def __init__(
        self,
        cfg: OuterConfig,
        exchange: Exchange,
        timing: GraceTracker | None = None,
        xcfg: ExchangeConfig = ExchangeConfig(),
        round_tokens: float = 1.0,
    ) -> None:
        self.cfg, self.exchange, self.xcfg = cfg, exchange, xcfg
        self.timing = timing if timing is not None else grace_tracker(xcfg)
        self.round_tokens = round_tokens
        self.feedback = ErrorFeedback(xcfg.error_feedback_decay)
        self._codecs = {True: from_config(xcfg, update=True), False: from_config(xcfg, update=False)}
        self._previous: tuple[int, list[torch.Tensor]] | None = None
        """(round, tensors) exchanged at the start of that round: the next round's model reference."""

    def _model_reference(self, rnd: int, now: list[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """§10: what this round's model exchange is measured against; remembers `now` for the next."""
        previous, self._previous = self._previous, (rnd, now)
        if previous is not None and previous[0] == rnd - 1:
            return tuple(previous[1])
        return tuple(now) if rnd == 0 else None  # round 0: the seed's model, the same everywhere

    def _request(
        self,
        tag: str,
        rnd: int,
        group: int,
        weight: float,
        step: int = 0,
        reference: tuple[torch.Tensor, ...] | None = ZERO,
        state_digest: bytes = b"",
        asks_reagree: bool = False,
        divergent: bool = False,
    ) -> ExchangeRequest:
        xcfg, weighted = self.xcfg, self.cfg.token_weighted and self.TOKEN_WEIGHTS
        # what is compared with zero is an update (Δ, gradients): only those take lossy codecs
        codec, results = self._codecs[reference is not None and len(reference) == 0]
        return ExchangeRequest(
            tag,
            rnd,
            group,
            weight if weighted else 1.0,
            xcfg.timeout_s,
            step,
            quorum_fraction=xcfg.quorum_fraction,
            quorum_wait_s=xcfg.quorum_wait_max_s,
            grace_s=self.timing.window_s(),
            result_wait_s=self.timing.result_wait_s(),
            codec=codec,
            result_codec=results,
            reference=reference,
            weight_floor=self.round_tokens if weighted else 1.0,
            state_digest=state_digest,
            asks_reagree=asks_reagree,
            divergent=divergent,
        )

    def _start_behind(
        self,
        tag: str,
        state: OuterState,
        group: int,
        weight: float,
        tensors: list[torch.Tensor] | None = None,
        reference: tuple[torch.Tensor, ...] | None = None,
        step: int = 0,
        state_digest: bytes = b"",
        divergent: bool = False,
    ) -> PendingExchange:
        """Start averaging the anchor in the background, for the length of the round's inner steps.

        Waiting for a partner's contribution here costs no compute until the round ends, so the
        part owners wait for the whole round plus `mix1_grace_s`, not the blocking window of §4:
        that window can be shorter than a transfer at WAN rates (bench/RESULTS.md, "round
        alignment and Mix1's wait").
        """
        if tensors is None:
            tensors, reference = state.anchor, self._model_reference(state.round, state.anchor)
        req = self._request(
            tag, state.round, group, weight, step, reference, state_digest, divergent=divergent
        )
        behind_s = (self.timing.t_step_s or 0.0) * self.cfg.num_inner_steps + self.xcfg.mix1_grace_s
        wait_s = min(self.xcfg.timeout_s, max(req.grace_s, behind_s))
        req = dataclasses.replace(req, grace_s=wait_s, result_wait_s=max(req.result_wait_s, wait_s))
        return self.exchange.start(tensors, req)

    def _take(self, tag: str, pending: PendingExchange, wait_s: float, report: RoundReport) -> ExchangeResult:
        """A background exchange's result, waited for at most `wait_s` and recorded as blocking time."""
        t0 = time.monotonic()
        return report.add(tag, pending.result(wait_s), time.monotonic() - t0)

    def _average(
        self,
        tensors: list[torch.Tensor],
        tag: str,
        rnd: int,
        group: int,
        weight: float,
        report: RoundReport,
        step: int = 0,
        reference: tuple[torch.Tensor, ...] | None = ZERO,
        state_digest: bytes = b"",
        asks_reagree: bool = False,
    ) -> ExchangeResult:
        t0 = time.monotonic()
        request = self._request(tag, rnd, group, weight, step, reference, state_digest, asks_reagree)
        feedback = request.codec.lossy and self.xcfg.error_feedback
        if feedback:
            tensors = self.feedback.contribution((tag, step), tensors)
        res = self.exchange.average(tensors, request)
        if feedback and isinstance(res, Ok):  # a failed exchange sent nothing: e is still owed
            self.feedback.delivered((tag, step), tensors, request.codec)
        if isinstance(res, Ok):
            self.timing.observe_exchange(res.quorum_s, res.sync_s)
        else:
            self.timing.observe_failure()
        self.timing.observe_arrivals(res.arrival_s)
        return report.add(tag, res, time.monotonic() - t0)


def _finish(
    params: list[torch.Tensor], state: OuterState, anchor: list[torch.Tensor], momentum: list[torch.Tensor]
) -> None:
    state.anchor, state.momentum = anchor, momentum
    state.round += 1
    copy_into(params, anchor)


def merged_fully(res: ExchangeResult) -> bool:
    """Every part is the group mean and nobody was left out: the members agree afterwards."""
    return isinstance(res, Ok) and not (res.own_parts or res.late_parts or res.left_out)


def state_digest(rnd: int, tensors: list[torch.Tensor]) -> bytes:
    """16 bytes that differ between two peers' (round, tensors) unless they are bit for bit equal;
    b"" where a tensor is not in host memory (hashing it there would first copy it off the device)."""
    if any(t.device.type != "cpu" for t in tensors):
        return b""
    h = hashlib.sha256(rnd.to_bytes(8, "little"))
    for t in tensors:
        h.update(
            t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data
        )  # hashlib drops the GIL here
    return h.digest()[:16]


class DiLoCo(_NoGradientSync, _BlockingExchanges):
    """§1: blocking all-peer average of Δ, Nesterov outer step; anchors re-agree in the background.

    A periodic re-agreement moves the whole model (φ and m) to fix a drift that may not exist: in
    the round before one, each contribution to the all-reduce of Δ carries a digest of its sender's
    (φ, m, round), and when that exchange merged fully with every digest equal, every member
    holds the same φ and m afterwards (the same mean Δ, the same outer step), so the re-agreement
    would average equal tensors and is skipped.

    A peer whose exchange did not merge fully (*diverged*) re-agrees every round until one
    succeeds, and a re-agreement needs every member. So a diverged peer asks for one with each
    contribution to the all-reduce of Δ, and a peer that merged such an ask joins the next round's
    re-agreement: without it, peers that diverged during a link cut would fail their re-agreement
    against a peer that had not (one that rejoined by download) until the periodic one. A peer
    answers an ask only `ASK_COOLDOWN_ROUNDS` after the last re-agreement it took part in: one
    that asks every round (a liar) makes the others re-agree at most every second round, and an
    ask sent while the asker's own re-agreement was in flight is not answered once that landed.
    """

    SKIPS_AGREED_REAGREE = True
    """Whether `end_round`'s exchange carries the digest (a subclass whose exchange does not
    cover the whole model in the round before a re-agreement turns it off)."""
    ASK_COOLDOWN_ROUNDS = 2
    """Rounds after a re-agreement this peer took part in before it joins one because another
    asked."""

    def __init__(
        self,
        cfg: OuterConfig,
        exchange: Exchange,
        timing: GraceTracker | None = None,
        xcfg: ExchangeConfig = ExchangeConfig(),
        round_tokens: float = 1.0,
    ) -> None:
        super().__init__(cfg, exchange, timing, xcfg, round_tokens)
        self._reagree: PendingExchange | None = None
        self._diverged = False
        self._asked = False
        """The last round's exchange merged a member's ask for a re-agreement."""
        self._last_reagree: int | None = None
        """The round of the last re-agreement this peer started, for whatever reason."""
        self._agreed = False
        """The last round's exchange showed every member with this peer's φ and m (then equal)."""
        self._digest: tuple[concurrent.futures.Future[bytes], list[torch.Tensor], list[torch.Tensor]] | None
        self._digest = None
        """The digest being taken this round, and the (φ, m) lists it describes: a state adopted
        since (a rejoin) is not vouched for."""
        self._hasher: concurrent.futures.ThreadPoolExecutor | None = None

    def begin_round(self, state: OuterState, weight: float) -> None:
        every = self.cfg.reagree_every
        both = [*state.anchor, *state.momentum]
        reference = self._model_reference(state.round, both)  # every round, for the next one
        due = bool(every) and state.round % every == every - 1
        last = self._last_reagree
        # an ask sent while the asker's own re-agreement was in flight may be stale by now: one
        # this peer took part in lately answered it
        asked = self._asked and (last is None or state.round - last >= self.ASK_COOLDOWN_ROUNDS)
        if asked and not self._diverged and not due:
            logger.info("round %d: re-agreement asked for by a member of the last round's group", state.round)
        if self._diverged or asked or (due and not self._agreed):
            self._last_reagree = state.round
            # the momenta too: after a partial round they differ, and would pull the anchors
            # apart again by α·β·(m_i − m_j) every round
            self._reagree = self._start_behind("reagree", state, ALL, weight, both, reference, divergent=True)
        elif due:
            logger.info("round %d: re-agreement skipped: every member's φ and m were equal", state.round)
        self._agreed = False
        self._digest = None
        if self.SKIPS_AGREED_REAGREE and every and (state.round + 2) % every == 0:
            # φ and m stay as they are until end_round: hashed behind the inner steps
            self._digest = (self._hash_behind(state.round, both), state.anchor, state.momentum)

    def _hash_behind(self, rnd: int, tensors: list[torch.Tensor]) -> concurrent.futures.Future[bytes]:
        """`state_digest(rnd, tensors)` on a thread of its own, while the inner steps run."""
        if self._hasher is None:
            self._hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="digest")
        return self._hasher.submit(state_digest, rnd, tensors)

    def _mixed_state(
        self, state: OuterState, report: RoundReport
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self._reagree is None:
            return state.anchor, state.momentum
        res = self._take("reagree", self._reagree, self.timing.window_s(), report)
        self._reagree = None
        if isinstance(res, Ok) and merged_fully(res):
            self._diverged = False
            n = len(state.anchor)
            return res.tensors[:n], res.tensors[n:]
        return state.anchor, state.momentum

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        delta = outer.pseudo_grad(state.anchor, [p.detach().float() for p in params])
        digest = b""
        if self._digest is not None and self._digest[1] is state.anchor and self._digest[2] is state.momentum:
            digest = self._digest[0].result()
        res = self._average(
            delta, "outer", state.round, ALL, weight, report, state_digest=digest, asks_reagree=self._diverged
        )
        self._asked = isinstance(res, Ok) and res.reagree_asked
        mean_delta = res.tensors if isinstance(res, Ok) else delta
        reagreed = self._reagree is not None
        anchor, momentum = self._mixed_state(state, report)
        self._diverged = self._diverged or not merged_fully(res)
        # a re-agreement landing this round replaced φ and m after they were hashed
        self._agreed = (
            bool(digest) and not reagreed and merged_fully(res) and isinstance(res, Ok) and res.agreed
        )
        _finish(
            params,
            state,
            *outer.nesterov_outer_step(
                anchor, momentum, mean_delta, self.cfg.outer_lr, self.cfg.outer_momentum
            ),
        )


class NoLoCo(_NoGradientSync, _BlockingExchanges):
    """§2: average with one random group per round; γ = α needs only mean_G(θ) (1× the model)."""

    def begin_round(self, state: OuterState, weight: float) -> None:
        return None

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        cfg, fast = self.cfg, [p.detach().float() for p in params]
        if cfg.effective_gamma == cfg.outer_lr:
            ref = tuple(state.anchor)  # θ after the round's steps, against φ before them
            res = self._average(fast, "noloco", state.round, cfg.group_size, weight, report, 0, ref)
            mean_fast = res.tensors if isinstance(res, Ok) else fast
            new = outer.noloco_shortcut_step(
                state.anchor, state.momentum, mean_fast, cfg.outer_lr, cfg.outer_momentum
            )
        else:
            n = len(fast)
            descent = [t - a for t, a in zip(fast, state.anchor, strict=True)]
            anchors = self._model_reference(state.round, state.anchor)
            both = None if anchors is None else (*(torch.zeros_like(d) for d in descent), *anchors)
            res = self._average(
                descent + state.anchor, "noloco", state.round, cfg.group_size, weight, report, 0, both
            )
            mean = res.tensors if isinstance(res, Ok) else descent + state.anchor
            new = outer.noloco_outer_step(
                state.anchor,
                state.momentum,
                mean[:n],
                mean[n:],
                cfg.outer_lr,
                cfg.outer_momentum,
                cfg.effective_gamma,
            )
        _finish(params, state, *new)


def mixed_indices(patterns: Sequence[str], names: Sequence[str]) -> list[int] | None:
    """Indices of the parameters partial Mix2 mixes (None: all of them)."""
    if not patterns:
        return None
    chosen = [i for i, name in enumerate(names) if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    if not chosen:
        shown = ", ".join(list(names)[:8]) + (", ..." if len(names) > 8 else "")
        raise ValueError(f"outer.mix2_tensors={list(patterns)} matches no parameter (names: {shown})")
    return chosen


class FactoredGossip(_NoGradientSync, _BlockingExchanges):
    """§3: Mix1 (background, anchors, group G1) overlaps the inner phase; Mix2 (blocking, Δ, G2),
    over every parameter or the subset `outer.mix2_tensors` names (partial Mix2)."""

    def __init__(
        self,
        cfg: OuterConfig,
        exchange: Exchange,
        timing: GraceTracker | None = None,
        xcfg: ExchangeConfig = ExchangeConfig(),
        round_tokens: float = 1.0,
        names: Sequence[str] = (),
    ) -> None:
        super().__init__(cfg, exchange, timing, xcfg, round_tokens)
        self._mix1: PendingExchange | None = None
        self._mixed = mixed_indices(cfg.mix2_tensors, names)

    def begin_round(self, state: OuterState, weight: float) -> None:
        self._mix1 = self._start_behind("mix1", state, self.cfg.group_size, weight)

    def _mix1_result(self, state: OuterState, report: RoundReport) -> list[torch.Tensor]:
        if self._mix1 is None:
            return state.anchor
        res = self._take("mix1", self._mix1, self.xcfg.mix1_grace_s, report)
        self._mix1 = None
        return res.tensors if isinstance(res, Ok) else state.anchor

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        cfg = self.cfg
        delta = outer.pseudo_grad(state.anchor, [p.detach().float() for p in params])
        if cfg.mix2_rounds > 0 and (state.round + 1) % cfg.mix2_every == 0:
            chosen = self._mixed if self._mixed is not None else range(len(delta))
            mixed = [delta[i] for i in chosen]
            for k in range(cfg.mix2_rounds):
                res = self._average(mixed, "mix2", state.round, cfg.mix2_group_size, weight, report, step=k)
                mixed = res.tensors if isinstance(res, Ok) else mixed
            delta = list(delta)
            for i, value in zip(chosen, mixed, strict=True):
                delta[i] = value
        mixed_anchor = self._mix1_result(state, report)
        _finish(
            params,
            state,
            *outer.nesterov_outer_step(mixed_anchor, state.momentum, delta, cfg.outer_lr, cfg.outer_momentum),
        )


class DataParallel(_BlockingExchanges):
    """Per-step gradient averaging over all peers: the quality ceiling, the bandwidth floor."""

    TOKEN_WEIGHTS = False
    """Every step's gradient counts once: weights are all 1, and so is the weight bound's floor."""

    def begin_round(self, state: OuterState, weight: float) -> None:
        return None

    def sync_gradients(self, grads: list[torch.Tensor], step: int, report: RoundReport) -> None:
        res = self._average(grads, "grad", step, ALL, 1.0, report)
        if isinstance(res, Ok):
            copy_into(grads, res.tensors)

    def ready_to_land(self, state: OuterState) -> bool:
        return False

    def land(self, params: list[torch.Tensor], state: OuterState, report: RoundReport) -> bool:
        return False

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        state.anchor = [p.detach().float().clone() for p in params]
        state.round += 1


class Independent(_NoGradientSync):
    """No exchange at all: the floor every communicating method must beat."""

    def __init__(
        self,
        cfg: OuterConfig,
        exchange: Exchange,
        timing: GraceTracker | None = None,
        xcfg: ExchangeConfig = ExchangeConfig(),
        round_tokens: float = 1.0,
    ) -> None:
        self.cfg = cfg

    def begin_round(self, state: OuterState, weight: float) -> None:
        return None

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        state.anchor = [p.detach().float().clone() for p in params]
        state.round += 1


_METHODS: dict[str, type] = {
    "diloco": DiLoCo,
    "noloco": NoLoCo,
    "factored": FactoredGossip,
    "data-parallel": DataParallel,
    "independent": Independent,
}


def build_method(
    cfg: OuterConfig,
    exchange: Exchange,
    timing: GraceTracker | None = None,
    xcfg: ExchangeConfig = ExchangeConfig(),
    round_tokens: float = 1.0,
    names: Sequence[str] = (),
) -> OuterMethod:
    """The strategy for `cfg.method`; `timing` is the peer's grace tracker (fed with step times),
    `xcfg` how its exchanges run (quorum, grace, time limits, codecs), `round_tokens` the
    tokens of one peer's full round (the floor of the weight bound, §10), `names` the parameters'
    names in order (for partial Mix2)."""
    if cfg.method == "factored":
        return FactoredGossip(cfg, exchange, timing, xcfg, round_tokens, names)
    if cfg.method == "diloco" and (cfg.fragments > 1 or cfg.overlaps_outer_step):
        from p2p_trainer.algo.streaming import StreamingDiLoCo  # it builds on DiLoCo, defined here

        return StreamingDiLoCo(cfg, exchange, timing, xcfg, round_tokens)
    method: OuterMethod = _METHODS[cfg.method](cfg, exchange, timing, xcfg, round_tokens)
    return method
