"""`Exchange` over the network: seeded random groups of the live peers, butterfly averaging.

Groups are derived from (run seed, tag, round, gossip step) and the live set the DHT shows, as in
the in-process backend, so no matchmaking round-trips are needed and groups change every round.
The member list is hashed into the exchange key: peers whose views of the swarm differ (a join
or a death not yet seen by all) simply do not meet, and time out into `Failed` instead of
mixing inconsistent parts. Waiting is bounded by the request's quorum and grace window
(`allreduce.py`). Peers that a failed send marked suspect (`health.py`) are not waited for, and
they leave the groups: the live view leaves out this peer's suspects and those other peers name in
their heartbeats (`swarm_view.py`), so the survivors' member lists agree again within about one
heartbeat period. Until then, members whose views differ form different keys and do not meet;
a dead member whose slot stayed in the groups for the whole heartbeat TTL would instead leave
its part of the vector unmerged (each survivor keeping its own values) round after round.

With `security.defences` on, every exchange applies the bounds of §10 (`robust.py`) against the
request's reference, and members this peer has penalised are left out of its groups (the
partition is still computed over the whole live view, so honest partners' keys agree).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence

import torch

from p2p_trainer.algo.grace import quorum_size
from p2p_trainer.algo.groups import group_of, group_seed
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.exchange.interface import ExchangeRequest, ExchangeResult, Failed, Ok
from p2p_trainer.fault_points import NO_FAULTS, FaultInjector, FaultPoint
from p2p_trainer.net.allreduce import GroupSpec, butterfly_average
from p2p_trainer.net.exchange_tap import NO_TAP, ExchangeTap
from p2p_trainer.net.exclusion import STRIKES
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.robust import Defence, Penalties
from p2p_trainer.net.transport import Transport

BACKGROUND_TAGS = frozenset({"mix1", "reagree"})
"""Exchanges that run behind the inner steps (fault point "mix1"); the others block."""


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().to("cpu", torch.float32).reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()].view(t.shape).to(t.device, t.dtype))
        offset += t.numel()
    return out


class _NetworkPending:
    def __init__(
        self,
        future: concurrent.futures.Future[ExchangeResult],
        like: list[torch.Tensor],
        taken: Callable[[ExchangeResult], None] | None = None,
        annotate: Callable[[ExchangeResult], ExchangeResult] = lambda res: res,
    ) -> None:
        """`taken` sees the result (flat) the first time the caller takes it: the tap's hook;
        `annotate` adds what the exchange learned since (late arrivals)."""
        self.future, self.like, self.taken, self.annotate = future, like, taken, annotate

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout_s: float) -> ExchangeResult:
        res = self.annotate(self._wait(timeout_s))
        if self.taken is not None:
            self.taken(res)
            self.taken = None
        if isinstance(res, Ok):
            return dataclasses.replace(res, tensors=_unflatten(res.tensors[0], self.like))
        return res

    def _wait(self, timeout_s: float) -> ExchangeResult:
        try:
            return self.future.result(timeout=max(0.0, timeout_s))
        except concurrent.futures.TimeoutError:
            return Failed(f"not finished within {timeout_s:.1f} s")
        except concurrent.futures.CancelledError:
            # the exchange's task was cancelled (the node is closing): a failed exchange, which the
            # round survives, not an error that ends the peer
            return Failed("the exchange was cancelled")


FINAL_CARRY_OFFENCES = 3
"""Offences in the rounds that leave a peer out of the final agreement too: a liar offends each
time its penalty lets it back into a group; an honest peer's noisy update crosses a bound once."""


class NetworkExchange:
    """Implements `Exchange` for one peer process."""

    def __init__(
        self,
        transport: Transport,
        live_peers: Callable[[], list[str]],
        run_id: str,
        seed: int,
        max_weight: float = math.inf,
        health: PeerHealth | None = None,
        faults: FaultInjector = NO_FAULTS,
        tap: ExchangeTap = NO_TAP,
        security: SecurityConfig = SecurityConfig(),
        out_of_step: Callable[[], set[str]] = set,
        outside_groups: Callable[[int], set[str]] = lambda _round: set(),
    ) -> None:
        """`out_of_step()`: live peers too far ahead to be in this round's groups (`in_step.py`;
        not asked for an exchange with `in_round` False); `outside_groups(round)`: peers, this one
        included, not counted in that round's groups (`entry.py`, `exclusion.py`). `faults` is told ("mix1" |
        "blocking", round) once this peer has delivered its contributions; `tap` sees each
        exchange's contribution and result (a test tool, `exchange_tap.py`); `security` says
        whether and how contributions and results are bounded (§10)."""
        self.transport, self.live_peers = transport, live_peers
        self.run_id, self.seed, self.max_weight = run_id, seed, max_weight
        self.me = transport.peer_id
        self.health = health or PeerHealth()
        self.faults, self.tap = faults, tap
        self.security = security
        self.out_of_step = out_of_step
        self.outside_groups = outside_groups
        self._exchanges = 0
        """Exchanges this peer started: the clock its penalties decay with (§10)."""
        self.penalties = Penalties(security.penalty_half_life, lambda: float(self._exchanges))
        self._final_penalties: Penalties | None = None
        """The ledger of exchanges outside the rounds (the final agreement), started from the
        rounds' repeat offenders (`FINAL_CARRY_OFFENCES`, or strikes enough for a vote, `exclusion.py`) when the first such exchange starts: there
        every live peer must merge for the result to be whole, and a peer penalised once for a
        noisy round's update would be left out of it for good. The final's own bounds still check
        every contribution, and a peer caught in one meeting is left out of the next."""
        self._late_s = 0.0
        """Latest offset at which a contribution that missed its window arrived (0: none since
        the last result): reported with the next result, for the grace window (§4)."""
        self._late_bytes = 0
        """Payload bytes acknowledged after their exchange's result was returned: added to the
        next result's `bytes_sent`, so the rounds' counts add up to what was delivered."""
        self._late_lock = threading.Lock()

    @property
    def final_penalties(self) -> Penalties:
        if self._final_penalties is None:
            self._final_penalties = self.penalties.carried(FINAL_CARRY_OFFENCES, STRIKES)
        return self._final_penalties

    def _live(self) -> set[str]:
        return set(self.live_peers()) | {self.me}

    def _gone(self, peer: str) -> bool:
        return self.health.suspect(peer) or peer not in self.live_peers()

    def _group(self, request: ExchangeRequest) -> GroupSpec:
        in_view = self._live()
        if request.in_round:
            in_view -= (self.out_of_step() | self.outside_groups(request.round)) - {self.me}
        live = sorted(in_view)
        seed = group_seed(self.seed, request.tag, request.round, request.gossip_step)
        _, members = group_of(self.me, live, request.group_size, seed)
        defence = None
        if self.security.defences:
            ledger = self.penalties if request.in_round else self.final_penalties
            defence = Defence.of(
                self.security,
                ledger,
                request.weight_floor,
                stretch=request.in_round,
                result_direction=not request.divergent,
            )
        digest = hashlib.sha256("|".join(members).encode()).hexdigest()[:12]
        prefix = f"{self.run_id}/{request.tag}/{request.round}/{request.gossip_step}/"
        return GroupSpec(
            key=prefix + digest,
            members=members,
            me=self.me,
            max_weight=self.max_weight,
            quorum=quorum_size(len(members), request.quorum_fraction),
            quorum_wait_s=request.quorum_wait_s,
            grace_s=request.grace_s,
            result_wait_s=request.result_wait_s,
            view_prefix=prefix,
            codec=request.codec,
            result_codec=request.results,
            defence=defence,  # its penalties leave members out of this peer's groups (§10)
            state_digest=request.state_digest,
            asks_reagree=request.asks_reagree,
        )

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> _NetworkPending:
        like = [t.detach() for t in tensors]
        flat = _flatten(tensors)  # the snapshot: training may change `tensors` from here on
        self._exchanges += 1
        group = self._group(request)
        deadline = time.monotonic() + request.timeout_s
        point: FaultPoint = "mix1" if request.tag in BACKGROUND_TAGS else "blocking"
        contributed = None
        if self.faults.wants(point, request.round):  # only then does the butterfly wait for delivery
            contributed = functools.partial(self.faults.reached, point, request.round)
        # our own weight obeys the bound the others check, or they would drop our contribution
        weight = min(request.weight, self.max_weight)
        taken = None
        if self.tap.enabled:
            taken = functools.partial(self.tap.record, request, group.key, group.members, weight, flat)
        waiting = self._why_outside(request)
        if waiting is not None:
            if contributed is not None:
                contributed()
            failed: concurrent.futures.Future[ExchangeResult] = concurrent.futures.Future()
            failed.set_result(Failed(waiting))
            return _NetworkPending(failed, like, taken)
        if len(group.members) == 1:
            if contributed is not None:
                contributed()  # alone: the fault point is reached all the same
            done: concurrent.futures.Future[ExchangeResult] = concurrent.futures.Future()
            done.set_result(Ok([flat], 1, request.weight, agreed=bool(request.state_digest)))
            return _NetworkPending(done, like, taken)
        reference = None
        if request.reference is not None:
            reference = _flatten(request.reference) if request.reference else torch.empty(0)
        fut = self.transport.submit(
            butterfly_average(
                self.transport,
                group,
                flat,
                weight,
                deadline,
                self.health,
                self._gone,
                contributed,
                self._observe_late,
                reference,
                self._observe_sent_late,
            )
        )
        annotate = self._with_late
        if self.security.defences and request.reference is None and request.tag in BACKGROUND_TAGS:
            annotate = self._unbounded  # this peer serves its part, but takes nothing unchecked
        return _NetworkPending(fut, like, taken, annotate)

    def _why_outside(self, request: ExchangeRequest) -> str | None:
        """Why this peer stays out of this round's groups (`entry.py`), or None."""
        if not request.in_round or self.me not in self.outside_groups(request.round):
            return None
        return (
            f"out of round {request.round}'s groups: waiting to enter them (its peers learn of this one"
            " first), or voted out by two peers (§10)"
        )

    def _observe_late(self, offset_s: float) -> None:
        self._late_s = max(self._late_s, offset_s)  # the transport's thread; a float store is atomic

    def _unbounded(self, res: ExchangeResult) -> ExchangeResult:
        """§10: a background model exchange with no reference to bound the others' values (the
        first round after a join or a rejoin) keeps this peer's own tensors; the swarm's anchor it
        just adopted is recent, and one round without Mix1 costs little."""
        res = self._with_late(res)
        if not isinstance(res, Ok):
            return res
        return Failed("no reference to bound the others' values yet (§10): own tensors kept", res.elapsed_s)

    def _observe_sent_late(self, n_bytes: int) -> None:
        with self._late_lock:
            self._late_bytes += n_bytes

    def _with_late(self, res: ExchangeResult) -> ExchangeResult:
        late, self._late_s = self._late_s, 0.0
        if late:
            res = dataclasses.replace(res, arrival_s=max(res.arrival_s, late))
        if isinstance(res, Ok):
            with self._late_lock:
                sent_late, self._late_bytes = self._late_bytes, 0
            res = dataclasses.replace(res, bytes_sent=res.bytes_sent + sent_late)
        return res

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        return self.start(tensors, request).result(request.timeout_s + 1.0)

    def num_live_peers(self) -> int:
        return len(self._live())

    def close(self) -> None:
        self.transport.close()
