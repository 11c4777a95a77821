"""Streaming DiLoCo (§1, arXiv 2501.18512): DiLoCo's outer step one fragment of the model at a time.

The parameters are cut into P fragments of about equal size (`split_fragments`, contiguous in
parameter order). Round r averages fragment p = r mod P over all peers: Δ_p = φ_p − θ_p, then
DiLoCo's Nesterov step on (φ_p, m_p) only. Each fragment is averaged every P rounds and a round
moves 1/P of the model, so the link's peak load falls by P.

With overlap (`outer.fragment_overlap`, the default for P > 1; `outer.overlap` for P = 1, where
the one fragment is the whole model: overlapped DiLoCo) the fragment's exchange is started at the
round's end and runs behind the next round's inner steps; its outer step lands at that round's
end (waiting there for an exchange still under way, within its own windows and deadline):
φ_p, m_p ← step(φ_p, m_p, mean Δ_p), and θ_p ← φ_p + (θ_p − θ_p at the exchange's start),
so the inner steps made while the exchange was under way are kept on top of the new anchor. A
failed or partial exchange applies the peer's own Δ_p (the group of one) and, as in DiLoCo,
starts a re-agreement of all anchors and momenta in the next round; the re-agreement's
correction of φ is added to θ as well, so the local progress is kept through it.

The periodic re-agreement (`outer.reagree_every`) moves the whole model, φ and m, so on a slow
link it takes several rounds' worth of time (6.3–6.6 s against 1.7 s rounds on the WAN testbed,
P = 2, H = 5) and blocks the round it lands in. It is skipped when every fragment is vouched for:
each fragment exchange carries a digest of the sender's (round, φ_p, m_p) as it starts, and one
that merged fully with every member's digest equal leaves φ_p and m_p equal on every member (the
same mean Δ_p, the same step). A fragment whose last exchange did not is not vouched for, and a
state adopted from a donor vouches for none.
"""

from __future__ import annotations

import concurrent.futures
import operator
import time
from dataclasses import dataclass
from typing import Any

import torch

from p2p_trainer.algo import outer
from p2p_trainer.algo.methods import DiLoCo, OuterState, RoundReport, copy_into, merged_fully, state_digest
from p2p_trainer.exchange.interface import ALL, ZERO, ExchangeRequest, ExchangeResult, Ok, PendingExchange

TAG = "fragment"


def split_fragments(sizes: list[int], parts: int) -> list[list[int]]:
    """Tensor indices of `parts` contiguous fragments of about equal total size (none empty)."""
    if parts > len(sizes):
        raise ValueError(f"outer.fragments={parts} exceeds the model's {len(sizes)} parameter tensors")
    fragments: list[list[int]] = []
    current: list[int] = []
    total, acc = sum(sizes), 0
    for i, size in enumerate(sizes):
        current.append(i)
        acc += size
        left_tensors, left_parts = len(sizes) - i - 1, parts - len(fragments) - 1
        full = acc >= total * (len(fragments) + 1) / parts
        if left_parts > 0 and (full or left_tensors == left_parts):
            fragments.append(current)
            current = []
    fragments.append(current)
    return fragments


@dataclass
class _InFlight:
    fragment: int
    pending: PendingExchange
    request: ExchangeRequest
    sent: list[torch.Tensor]
    """What was sent (Δ_p plus any error feedback)."""
    delta: list[torch.Tensor]
    """Δ_p itself: applied alone if the exchange fails."""
    snapshot: list[torch.Tensor]
    """θ_p at the exchange's start."""
    deadline: float
    """When the exchange itself gives up (time.monotonic())."""
    digest: bytes
    """Of this peer's (round, φ_p, m_p) at the start, sent with its contribution."""


class StreamingDiLoCo(DiLoCo):
    """DiLoCo with `outer.fragments` > 1, or with `outer.overlap` (one fragment: the whole model)."""

    SKIPS_AGREED_REAGREE = False
    """A round's exchange covers one fragment, landing a round late: it cannot vouch for φ and m
    alone; the fragments' exchanges vouch together instead (`_vouched`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fragments: list[list[int]] | None = None
        """Tensor indices per fragment, cut at the first round (the parameters' sizes)."""
        self._flight: _InFlight | None = None
        """The fragment exchange running behind this round's inner steps."""
        self._vouched: set[int] = set()
        """Fragments whose last exchange merged fully with every member's digest equal to this
        peer's: their φ_p and m_p are equal on every member since."""
        self._vouched_in: OuterState | None = None
        """The state they belong to: an adopted one (a rejoin) vouches for no fragment."""
        self._hashing: tuple[concurrent.futures.Future[bytes], list[torch.Tensor]] | None = None
        """This round's fragment digest, taken behind the inner steps, and the fragment's anchor
        and momentum tensors it read (a re-agreement, an adopted state or a landing of this
        fragment puts new tensors in their place, and the digest is taken again)."""

    def begin_round(self, state: OuterState, weight: float) -> None:
        super().begin_round(state, weight)
        self._hashing = None
        p = state.round % self.cfg.fragments
        # the exchange landing at this round's end changes its own fragment: with P = 1, or one
        # left over from before an adopted state, that is this round's, hashed then instead
        if not self._vouching(state.round) or (self._flight is not None and self._flight.fragment == p):
            return
        if self._fragments is None:
            self._fragments = split_fragments([a.numel() for a in state.anchor], self.cfg.fragments)
        chosen = self._fragments[p]
        tensors = [state.anchor[i] for i in chosen] + [state.momentum[i] for i in chosen]
        self._hashing = (self._hash_behind(state.round, tensors), tensors)

    def _fragment_digest(
        self,
        rnd: int,
        anchor: list[torch.Tensor],
        momentum: list[torch.Tensor],
        chosen: list[int],
    ) -> bytes:
        """The digest of round `rnd`'s fragment: the one taken behind the inner steps if it read
        these very tensors, else hashed now. Tensors, not lists, are compared: an early landing
        (`land`) gives the state new lists that still hold this fragment's tensors."""
        tensors = [anchor[i] for i in chosen] + [momentum[i] for i in chosen]
        if self._hashing is not None:
            digest, hashed = self._hashing
            if len(hashed) == len(tensors) and all(map(operator.is_, hashed, tensors)):
                return digest.result()
        return state_digest(rnd, tensors)

    def end_round(
        self, params: list[torch.Tensor], state: OuterState, weight: float, report: RoundReport
    ) -> None:
        cfg = self.cfg
        if self._fragments is None:
            self._fragments = split_fragments([p.numel() for p in params], cfg.fragments)
        if state is not self._vouched_in:
            self._vouched.clear()
            self._vouched_in = state
        fast = [p.detach().float().clone() for p in params]
        anchor, momentum = self._mixed_state(state, report)
        if anchor is not state.anchor:  # a re-agreement landed: keep the local progress on top of it
            fast = [f + (a - a0) for f, a, a0 in zip(fast, anchor, state.anchor, strict=True)]
        anchor, momentum = list(anchor), list(momentum)
        if self._flight is not None:
            self._land(self._flight, anchor, momentum, fast, report)
            self._flight = None
        p = state.round % cfg.fragments
        chosen = self._fragments[p]
        delta = [anchor[i] - fast[i] for i in chosen]
        digest = b""
        if self._vouching(state.round):
            digest = self._fragment_digest(state.round, anchor, momentum, chosen)
        self._hashing = None
        if cfg.overlaps_outer_step:
            snapshot = [fast[i].clone() for i in chosen]
            self._flight = self._launch(p, delta, snapshot, state, weight, digest)
        else:
            res = self._average(delta, TAG, state.round, ALL, weight, report, step=p, state_digest=digest)
            self._settled(p, res, digest)
            self._step(chosen, res.tensors if isinstance(res, Ok) else delta, anchor, momentum)
            for i in chosen:
                fast[i] = anchor[i].clone()
        state.anchor, state.momentum = anchor, momentum
        state.round += 1
        copy_into(params, fast)
        # read by the next round's begin_round: a due re-agreement is skipped if every fragment
        # is vouched for (one still in flight is vouched for by its last exchange until it lands)
        self._agreed = len(self._vouched) == cfg.fragments

    def ready_to_land(self, state: OuterState) -> bool:
        """The exchange launched at the last round's end has its result, to land before this
        round's end (`outer.land_at_step`, §1). Not while a re-agreement runs: it started from the
        φ before the landing and would replace it at the round's end, so the landing waits for
        it; nor one launched before an adopted state (a rejoin): the round's end deals with it."""
        flight = self._flight
        return (
            flight is not None
            and self._reagree is None
            and flight.request.round == state.round - 1
            and flight.pending.done()
        )

    def land(self, params: list[torch.Tensor], state: OuterState, report: RoundReport) -> bool:
        """Land the exchange `ready_to_land` names: θ keeps the inner steps made since it began."""
        if not self.ready_to_land(state):
            return False
        assert self._flight is not None
        fast = [p.detach().float().clone() for p in params]
        anchor, momentum = list(state.anchor), list(state.momentum)
        self._land(self._flight, anchor, momentum, fast, report)
        self._flight = None
        state.anchor, state.momentum = anchor, momentum
        copy_into(params, fast)
        return True

    def _vouching(self, rnd: int) -> bool:
        """Whether round `rnd`'s fragment exchange carries a digest: only the P + 1 rounds before
        a due re-agreement, whose exchanges have landed by then (hashing φ_p and m_p is a pass over
        them; it runs behind the round's inner steps where it can, `begin_round`)."""
        every = self.cfg.reagree_every
        return bool(every) and 1 <= (every - 1 - rnd) % every <= self.cfg.fragments + 1

    def _settled(self, fragment: int, res: ExchangeResult, digest: bytes) -> None:
        """Fragment exchange `res` is applied: whether it vouches for the fragment's φ_p and m_p."""
        self._diverged = self._diverged or not merged_fully(res)
        if bool(digest) and merged_fully(res) and isinstance(res, Ok) and res.agreed:
            self._vouched.add(fragment)
        else:
            self._vouched.discard(fragment)

    def _launch(
        self,
        p: int,
        delta: list[torch.Tensor],
        snapshot: list[torch.Tensor],
        state: OuterState,
        weight: float,
        digest: bytes,
    ) -> _InFlight:
        request = self._request(TAG, state.round, ALL, weight, p, ZERO)
        feedback = request.codec.lossy and self.xcfg.error_feedback
        sent = self.feedback.contribution((TAG, p), delta) if feedback else delta
        pending = self._start_behind(TAG, state, ALL, weight, sent, ZERO, step=p, state_digest=digest)
        deadline = time.monotonic() + request.timeout_s + 1.0
        return _InFlight(p, pending, request, sent, delta, snapshot, deadline, digest)

    def _land(
        self,
        flight: _InFlight,
        anchor: list[torch.Tensor],
        momentum: list[torch.Tensor],
        fast: list[torch.Tensor],
        report: RoundReport,
    ) -> None:
        assert self._fragments is not None
        # an exchange slower than the round is waited for within its own windows (quorum, grace,
        # deadline), not given up: a given-up exchange leaves the anchors apart, and the
        # re-agreement that follows moves the whole model, so a slow link would never merge.
        # The pause stays within a blocking exchange's bound (a partner that died mid-exchange).
        left_s = min(flight.deadline - time.monotonic(), self.xcfg.pause_bound_s)
        res = self._take(TAG, flight.pending, max(self.xcfg.mix1_grace_s, left_s), report)
        if isinstance(res, Ok) and flight.request.codec.lossy and self.xcfg.error_feedback:
            self.feedback.delivered((TAG, flight.fragment), flight.sent, flight.request.codec)
        self._settled(flight.fragment, res, flight.digest)
        chosen = self._fragments[flight.fragment]
        self._step(chosen, res.tensors if isinstance(res, Ok) else flight.delta, anchor, momentum)
        for j, i in enumerate(chosen):
            fast[i] = anchor[i] + (fast[i] - flight.snapshot[j])

    def _step(
        self,
        chosen: list[int],
        mean_delta: list[torch.Tensor],
        anchor: list[torch.Tensor],
        momentum: list[torch.Tensor],
    ) -> None:
        phi, m = outer.nesterov_outer_step(
            [anchor[i] for i in chosen],
            [momentum[i] for i in chosen],
            mean_delta,
            self.cfg.outer_lr,
            self.cfg.outer_momentum,
        )
        for j, i in enumerate(chosen):
            anchor[i], momentum[i] = phi[j], m[j]
