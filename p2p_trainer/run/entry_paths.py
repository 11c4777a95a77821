"""How a peer gets into step with its swarm: late join, rejoin after a stall or a cut, lost sight.

`late_join` downloads the swarm's state on arrival; `Rejoin` and `RegainSight` bring a running
peer back to the majority's round; the rest are the pure rules they follow.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from pathlib import Path

from p2p_trainer.exchange.interface import Failed
from p2p_trainer.fault_points import NO_FAULTS, FaultInjector
from p2p_trainer.net import records
from p2p_trainer.net.donor_check import bounded_momentum, confirmed_download, round_refusal
from p2p_trainer.net.entry import ENTRY_PERIODS, GroupEntry, has_left, in_groups
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.net.robust import Penalties
from p2p_trainer.net.state_sync import (
    DonorState,
    await_state_round,
    catch_up_steps,
    donor_order,
    download_state,
    first_download,
    heartbeat_lag_rounds,
    state_header,
)
from p2p_trainer.net.swarm_view import SwarmView
from p2p_trainer.net.transport import Transport
from p2p_trainer.net.view_bounds import median_round
from p2p_trainer.round_log import RejoinRecord, read_log
from p2p_trainer.train.trainer import Peer, RoundMetrics, adopt_state

logger = logging.getLogger(__name__)


def late_join(
    peer: Peer,
    view: SwarmView,
    transport: Transport,
    run_id: str,
    tokens_per_round: int,
    donor_wait_s: float = 0.0,
    faults: FaultInjector = NO_FAULTS,
) -> bool:
    """Download (φ, m, round) from a live peer at the swarm's latest round; the next one if it fails.

    Joiners spread over the freshest donors (`donor_order`); a donor that dies or stalls mid-transfer
    fails within the stall timeout and the next donor is tried. Retried for the network config's
    `late_join_patience_s`, since a new
    node's p2p routing needs a few seconds to reach the others. With no donor in sight, a new swarm
    is assumed at once, unless `donor_wait_s` > 0 (a peer rejoining its swarm): it keeps looking.
    """
    net = peer.cfg.network
    patience_s = net.late_join_patience_s
    deadline = time.monotonic() + patience_s
    donor_deadline = time.monotonic() + donor_wait_s
    attempt = 0
    contents = StateLossCheck(peer, peer.cfg.security.donor_loss_margin)
    entry: GroupEntry | None = None
    entry_until = 0.0
    provisional = False
    while True:
        beats = view.heartbeats()
        logger.info("swarm on arrival: %s", ", ".join(f"{h.peer_id[-8:]}@r{h.round}" for h in beats))
        # peers stopping for their time bound (`entry.py`) keep their last round: neither a vote on
        # where the swarm is nor a donor (their state stops there, and they leave within seconds);
        # nor are newcomers before their entry round (rounds behind the swarm, and with no state
        # yet or one trained alone). In a tiny swarm that leaves fewer votes against a forged round
        # while newcomers wait: the round window (§10) still bounds what a donor may claim.
        beats = [h for h in beats if not has_left(h, h.round) and in_groups(h, h.round)]
        # heartbeats say the rounds per second (throughput / tokens per round) of their peers
        rounds_per_s = max((h.throughput_tokens_per_s for h in beats), default=0.0) / tokens_per_round
        slack = heartbeat_lag_rounds(rounds_per_s, 2 * view.period_s)
        median = median_round([h.round for h in beats])
        donors = _plausible_donors(peer, beats, median, donor_order(transport.peer_id, _rounds(beats), slack))
        donors = [d for d in donors if d not in contents.refused]  # it would serve the same again
        if not donors and entry is not None:
            logger.warning(
                "no donor in sight to serve the swarm's state again; entering with round %d's", entry.adopted
            )
            return True
        if not donors and time.monotonic() >= donor_deadline:
            if provisional:  # no swarm to join after all: this peer starts one, counted from round 0
                view.enter_groups_at(0)
            return False
        if donors and entry is None:
            if not provisional:
                # Until the download names the real entry (`enter_groups`), one no group reaches:
                # a view that reads it leaves this peer out whatever the age of its round-0
                # heartbeat, which a view in its first periods of training, or one that reads a
                # round-0 heartbeat older than two periods (`at_round_zero`), would count.
                view.enter_groups_at(peer.cfg.rounds)
                provisional = True
            # the entry round is timed by the swarm's pace: measured before the download, so that
            # the catch-up (`catch_up_steps`) counts from the moment the state arrives
            view.wait_for_pace(ENTRY_PERIODS * view.period_s)
        if donors and entry is not None:
            await_entry(view, transport, run_id, donors, entry, entry_until, net.state_stall_timeout_s)
        attempt += 1
        if donors:
            faults.reached("download", attempt)
        got = _download_from(peer, transport, run_id, donors, median, contents)
        if not isinstance(got, list):
            state, donor = got
            skip = catch_up_steps(state, peer.cfg.outer.num_inner_steps, peer.timing.t_step_s)
            adopt_state(peer, state, skip)
            if entry is not None:
                logger.info(
                    "entering the groups at round %d with the swarm's state of round %d from %s",
                    entry.enters,
                    state.round,
                    donor[-8:],
                )
                return True
            logger.info("late join: adopted round %d from %s, %d steps in", state.round, donor[-8:], skip)
            adopted_at = time.monotonic()
            entry = enter_groups(peer, view, state)
            entry_until = adopted_at + entry.wait_limit_s(ENTRY_PERIODS * view.period_s)
            if not entry.refreshes:
                return True
            continue  # the swarm is near the entry round: its state again, as that round begins
        if entry is not None:
            logger.warning("no donor served the swarm's state again; entering with round %d's", entry.adopted)
            return True
        if donors and time.monotonic() > deadline:
            raise RuntimeError(f"no live peer could serve the swarm's state within {patience_s:.0f} s")
        time.sleep(2.0)


def enter_groups(peer: Peer, view: SwarmView, state: DonorState) -> GroupEntry:
    """Plan a late joiner's way into the groups (`entry.py`) once it adopted `state` and left
    `peer.skip_steps` of its round out; the others learn it from the heartbeat. Rounds are timed
    by the others' heartbeats (`RoundPace`; `late_join` waits for it before it downloads): the
    donor's step time, its claim alone, only says when the adopted round's exchange starts.
    Where the entry is several rounds away, waits (without training) until the others' heartbeats
    show the swarm near it: the caller then waits for a donor to serve the entry round and
    downloads the swarm's state again."""
    h = peer.cfg.outer.num_inner_steps
    step_s = peer.timing.t_step_s or state.donor_step_s
    entry_s = ENTRY_PERIODS * view.period_s
    t0 = time.monotonic()
    entry = GroupEntry.plan(state.round, (h - peer.skip_steps) * step_s, view.round_s(), entry_s)
    # the entry first: a heartbeat with the adopted round and no entry yet would be counted
    view.enter_groups_at(entry.enters)
    # the adopted round too: a heartbeat still saying round 0 would keep this peer among the
    # joining (`SwarmView._joining`) in views that read it before its first round
    view.enter_round(state.round)
    if entry.enters == state.round:
        return entry
    if not entry.refreshes:
        logger.info(
            "entering the swarm's groups at round %d: until then the others' views are still "
            "learning of this peer, and it trains alone",
            entry.enters,
        )
        return entry
    # a state older than the entry round would leave this peer to train alone up to it, and drift
    # (§10 bounds); the caller then waits for a donor to serve the entry round itself. No least
    # wait: the views leave this peer out before its entry round however soon it downloads
    near = entry.heartbeat_round(view.period_s)
    reached = view.wait_for_round(near, 0.0, entry.wait_limit_s(entry_s))
    logger.info(
        "entering the swarm's groups at round %d (rounds of about %.2f s): waited %.1f s for the "
        "swarm to near it%s",
        entry.enters,
        entry.round_s,
        time.monotonic() - t0,
        "" if reached else f" (the swarm had not reached round {near})",
    )
    return entry


ENTRY_ASKS = 2
"""Donors asked in turn which round they serve before a newcomer falls back to the heartbeats."""


def await_entry(
    view: SwarmView,
    transport: Transport,
    run_id: str,
    donors: list[str],
    entry: GroupEntry,
    until: float,
    timeout_s: float,
) -> None:
    """Wait, before downloading the swarm's state again, until the swarm begins the entry round:
    the catch-up then brings this peer to that round's exchange, which counts it, instead of
    leaving its group to wait for it. A donor says when (`await_state_round`), within the time the
    swarm needs to get there from where the heartbeats showed it (`GroupEntry.heartbeat_round`),
    so a donor that lies about its rounds delays this peer no more than that; where no donor says
    so in time, the heartbeats do, as late as they lag (up to `until`)."""
    near = entry.heartbeat_round(view.period_s)
    # the heartbeats showed `near` up to two periods after the swarm was there, and the rounds
    # from there take about that long: the entry round began by now + those rounds, give or take
    asked_until = min(until, time.monotonic() + (entry.enters - near) * entry.round_s + view.period_s / 2)
    for donor in donors[:ENTRY_ASKS]:
        # one ask may not take the whole window: a donor that hangs leaves time to ask the next
        ask_s = min(timeout_s, max(1.0, (asked_until - time.monotonic()) / 4))
        served = await_state_round(transport, donor, run_id, entry.enters, entry.round_s, asked_until, ask_s)
        if served is not None and served >= entry.enters:
            return
        if served is not None:
            break  # it answered, but not that the round began (in time, or before it failed)
    left_s = until - time.monotonic()
    logger.warning(
        "no donor said the swarm began round %d; waiting up to %.1f s for the heartbeats to show it",
        entry.enters,
        max(0.0, left_s),
    )
    view.wait_for_round(entry.enters, 0.0, max(0.0, left_s))


def _rounds(beats: list[Heartbeat]) -> list[tuple[str, int]]:
    return [(h.peer_id, h.round) for h in beats]


def _plausible_donors(peer: Peer, beats: list[Heartbeat], median: int | None, donors: list[str]) -> list[str]:
    """`donors` without those whose advertised round no honest peer of this run could be at (with
    the defences on): a forged heartbeat at a huge round must not send every joiner after a donor
    that serves nothing, and when only such donors are in sight the swarm has not started."""
    sec = peer.cfg.security
    if not sec.defences:
        return donors
    rounds = dict(_rounds(beats))
    kept = []
    for donor in donors:
        why = round_refusal(rounds.get(donor, 0), median, peer.cfg.rounds, sec.round_window)
        if why is None:
            kept.append(donor)
        else:
            logger.warning("not asking %s for the swarm's state: its %s", donor[-8:], why)
    return kept


def _download_from(
    peer: Peer,
    transport: Transport,
    run_id: str,
    donors: list[str],
    median: int | None,
    contents: StateLossCheck,
) -> tuple[DonorState, str] | list[str]:
    """The first donor's state; with the defences on, one whose round is plausible and that a second
    donor confirms (`donor_check.py`)."""
    net, sec = peer.cfg.network, peer.cfg.security

    def download(donor: str) -> DonorState | Failed:
        timeout_s = net.state_download_timeout_s
        return download_state(
            transport, donor, run_id, peer.state.anchor, timeout_s, net.state_stall_timeout_s
        )

    if not sec.defences:
        return first_download(donors, download)
    return confirmed_download(
        donors,
        download,
        lambda donor: state_header(transport, donor, run_id, net.state_stall_timeout_s),
        lambda rnd: round_refusal(rnd, median, peer.cfg.rounds, sec.round_window),
        sec.donor_tolerance,
        contents,
    )


class StateLossCheck:
    """Refuses a donor's state whose φ predicts this peer's validation batches worse than this
    peer's own φ does, by more than `margin` (a fraction): training lowers that loss, so a state
    above it was not trained from this run's model. It catches a poisoned state that a plausible
    round and agreeing donors let through (a forger alone in sight, Sybils that agree)."""

    def __init__(self, peer: Peer, margin: float) -> None:
        self.peer, self.margin = peer, margin
        self._own: float | None = None
        self._warned = False
        self.refused: set[str] = set()
        """Donors whose state this check refused: not asked again by this peer."""

    def prepare(self) -> None:
        """Measure this peer's own loss now; the first check does, and a peer that trained since
        (a rejoin) calls this again."""
        if not self.peer.val:
            if not self._warned:
                logger.warning(
                    "donor states are not checked against a validation loss: no validation batches"
                )
                self._warned = True
            return
        self._own = self.peer.evaluate(self.peer.state.anchor)

    def __call__(self, state: DonorState, donor: str) -> str | None:
        if self._own is None:
            self.prepare()
        if self._own is None:
            return None
        theirs = self.peer.evaluate(state.anchor)
        bound = self._own * (1.0 + self.margin)
        if not math.isfinite(theirs) or theirs > bound:
            self.refused.add(donor)
            return (
                f"its round-{state.round} state has validation loss {theirs:.4g} here, above this "
                f"peer's own {self._own:.4g} by more than {self.margin:.0%} (security.donor_loss_margin)"
            )
        logger.info("state of round %d: validation loss %.4f here (own %.4f)", state.round, theirs, self._own)
        return None


def rejoin_target(my_round: int, other_rounds: list[int], lag_rounds: int) -> int | None:
    """The swarm's round to rejoin, or None if this peer is within `lag_rounds` of it.

    The swarm's round is the (upper) median of all live peers' rounds, this one's included: the
    majority's. Groups meet only within one round, so a peer left behind (stalled, cut off) would
    otherwise average with nobody for the rest of the run, and a peer cut off alone races ahead
    (its rounds have no one to wait for) and must come back to the majority, not pull it along.
    """
    if lag_rounds <= 0 or not other_rounds:
        return None
    rounds = sorted([my_round, *other_rounds])
    target = rounds[len(rounds) // 2]
    if target - my_round >= lag_rounds:
        return target
    # Going back discards work, and heartbeats of a starved machine make others look behind:
    # only a peer far ahead (one that trained alone behind a cut link) goes back.
    return target if my_round - target >= 3 * lag_rounds else None


def outvoted(others: dict[str, int], penalised: set[str]) -> list[str]:
    """The live peers (id -> round) this peer penalises, when they are at least two and at least
    half of the live others; otherwise none.

    Honest peers whose models drifted apart (one trained alone behind a cut link for a while, at
    the others' pace) fail each other's §10 bounds and penalise each other: every merge between
    them is refused. Only a count tells which side differs: the peer that finds most of the swarm
    out of bounds is the one that drifted, and adopts the swarm's state. One liar is never enough
    to make an honest peer give up its state, and a donor's state is checked as any other.
    """
    against = sorted(p for p in others if p in penalised)
    return against if len(against) >= 2 and 2 * len(against) >= len(others) else []


def alone_rounds(previous: int, m: RoundMetrics) -> int:
    """Consecutive rounds in which this peer met its groups late or not at all (rounds without
    exchanges do not count).

    Late: a partial merge whose other parts came back without this peer's values (`late_parts`),
    i.e. its group had moved on; a peer a part-round behind stays there, since every late round
    costs it the result waits. A partial merge because a partner died is not this peer's lag.
    Heartbeat rounds lag by up to a heartbeat period (many rounds when rounds are short), so a
    peer that still meets its groups must never act on them; one that keeps missing them may, and
    `rejoin_target` still requires the heartbeats to put it `lag_rounds` behind.
    """
    if not m.report.exchanges:
        return previous
    met = any(e.merged and e.late_parts == 0 for e in m.report.exchanges)
    return 0 if met else previous + 1


def estimated_round(beat: Heartbeat, now: float, tokens_per_round: int) -> int:
    """A peer's round now, from its heartbeat: the round it reported plus the rounds its reported
    throughput allows since then (heartbeats are up to a period old; rounds can be much shorter)."""
    rounds_since = max(0.0, now - beat.timestamp) * beat.throughput_tokens_per_s / max(1, tokens_per_round)
    # the throughput is another peer's claim: an absurd one (or an overflow to inf) adds nothing
    return beat.round + (int(min(rounds_since, 1e9)) if math.isfinite(rounds_since) else 0)


HEADER_TIMEOUT_S = 3.0
"""How long a rejoin waits for a donor's state header (all asked at once): a live donor answers
within a round trip, and one that does not is left out of that look's downloads."""
ASKED_DONORS = 5
"""How many donors, nearest the target, a rejoin asks for the round they serve."""


class Rejoin:
    """Brings a peer back to the swarm's round after `lag_rounds` rounds that merged with no one."""

    def __init__(
        self,
        peer: Peer,
        view: SwarmView,
        transport: Transport,
        run_id: str,
        lag_rounds: int,
        tokens_per_round: int,
        penalties: Penalties | None = None,
    ) -> None:
        """`penalties`: this peer's §10 penalties (None: defences off), for `outvoted`."""
        self.peer, self.view, self.transport, self.run_id = peer, view, transport, run_id
        self.lag_rounds, self.tokens_per_round = lag_rounds, tokens_per_round
        self.penalties = penalties
        self.alone = 0
        self.contents = StateLossCheck(peer, peer.cfg.security.donor_loss_margin)
        self._next_look = 0.0
        """time.monotonic() before which a peer that looked and stayed does not look again."""

    def after_round(self, m: RoundMetrics) -> RejoinRecord | None:
        """Call after every round; returns a metrics record if the peer rejoined."""
        if m.round < self.view.status.enters_round:
            return None  # waiting to enter the groups (`entry.py`): alone by design, and in step
        self.alone = alone_rounds(self.alone, m)
        if self.lag_rounds <= 0 or self.alone < self.lag_rounds:
            return None  # a peer that meets its groups never acts on (stale) heartbeat rounds
        if time.monotonic() < self._next_look:
            return None  # the heartbeats it would read are those it just read
        left = self._rejoin()
        if left is None:
            self._next_look = time.monotonic() + self.view.period_s
            return None
        self.alone = 0
        return RejoinRecord(
            from_round=left, to_round=self.peer.state.round, catch_up_steps=self.peer.skip_steps
        )

    def _served_target(self, others: dict[str, int], target: int) -> tuple[int | None, set[str]]:
        """The rejoin target again, with the rounds the donors nearest `target` serve now (their
        state headers: a tenth of a state each in their rate limits, `ServeLimits`) in place of
        their heartbeats' estimates, which `others` takes; and the donors asked that cannot be
        downloaded from in this look (no header within HEADER_TIMEOUT_S, or, with the defences
        on, a round its window refuses). A heartbeat's round is up to two periods old, and
        extrapolated by one round's throughput it overshoots where rounds alternate between
        quick merges and waits: a peer in step with the swarm would download states only to
        throw them away, and spend the rate limit a real rejoin needs."""
        peer, sec = self.peer, self.peer.cfg.security
        nearest = sorted(
            (p for p in others if p not in self.contents.refused), key=lambda p: abs(others[p] - target)
        )[:ASKED_DONORS]
        median = median_round([peer.state.round, *others.values()])
        timeout_s = min(peer.cfg.network.state_stall_timeout_s, HEADER_TIMEOUT_S)
        with concurrent.futures.ThreadPoolExecutor(max(1, len(nearest))) as pool:
            headers = list(
                pool.map(lambda d: state_header(self.transport, d, self.run_id, timeout_s), nearest)
            )
        unusable: set[str] = set()
        for donor, got in zip(nearest, headers, strict=True):
            if isinstance(got, Failed):
                refusal: str | None = got.reason
            else:
                rnd = got[0]
                refusal = (
                    round_refusal(rnd, median, peer.cfg.rounds, sec.round_window) if sec.defences else None
                )
            if refusal is not None:
                logger.info("rejoin: donor %s left out of this look: %s", donor[-8:], refusal.splitlines()[0])
                unusable.add(donor)
            else:
                others[donor] = rnd
        served = rejoin_target(
            peer.state.round, [r for p, r in others.items() if p not in unusable], self.lag_rounds
        )
        if served is None:
            logger.info(
                "rejoin: the donors' headers put the swarm within reach (%s); kept own state",
                ", ".join(f"{p[-8:]}@r{others[p]}" for p in nearest if p not in unusable),
            )
        return served, unusable

    def _rejoin(self) -> int | None:
        peer, now = self.peer, records.now()
        # peers that stopped for their time bound (`entry.py`) are no swarm to catch up with:
        # the last peer training alone is not cut off
        others = {
            h.peer_id: estimated_round(h, now, self.tokens_per_round)
            for h in self.view.heartbeats()
            if h.peer_id != self.transport.peer_id and not has_left(h, h.round)
        }
        target = rejoin_target(peer.state.round, list(others.values()), self.lag_rounds)
        unusable: set[str] = set()
        if target is not None:
            target, unusable = self._served_target(others, target)
        against: list[str] = []
        if target is None and self.penalties is not None:
            against = outvoted(others, {p for p in others if self.penalties.excluded(p)})
            if against:
                rounds = sorted(others[p] for p in against)
                target = rounds[len(rounds) // 2]
                logger.info(
                    "rejoin: %d of %d live peers fail this peer's bounds: its state drifted; adopting theirs",
                    len(against),
                    len(others),
                )
        if target is None:
            return None
        left = peer.state.round
        candidates = [p for p in against or list(others) if p not in self.contents.refused | unusable]
        if candidates and peer.cfg.security.defences:
            self.contents.prepare()
        for donor in sorted(candidates, key=lambda p: (abs(others[p] - target), -others[p]))[:3]:
            net = peer.cfg.network
            got = download_state(
                self.transport,
                donor,
                self.run_id,
                peer.state.anchor,
                net.resync_download_timeout_s,
                net.state_stall_timeout_s,
            )
            if isinstance(got, Failed):
                logger.warning("rejoin download: %s", got.reason.splitlines()[0])
                continue
            arrived, sec = time.monotonic(), peer.cfg.security
            median = median_round([peer.state.round, *others.values()])
            refusal = (
                round_refusal(got.round, median, peer.cfg.rounds, sec.round_window) if sec.defences else None
            )
            if refusal is not None:
                logger.warning("rejoin: donor %s refused: %s", donor[-8:], refusal)
                continue
            if not against and (got.round - left) * (target - left) <= 0:
                # heartbeats over-estimated the donor: its state is not in the direction we meant to go
                logger.info(
                    "rejoin: donor %s is at round %d, not towards %d; kept own state",
                    donor[-8:],
                    got.round,
                    target,
                )
                continue
            refusal = self.contents(got, donor) if sec.defences else None
            if refusal is not None:
                logger.warning("rejoin: donor %s refused: %s", donor[-8:], refusal)
                continue
            got.round_elapsed_s += time.monotonic() - arrived  # the donor trained on meanwhile
            if sec.defences:  # nothing checked the donor's momentum: this peer's own bounds it
                got.momentum = bounded_momentum(got.momentum, [m.cpu() for m in peer.state.momentum])
            skip = catch_up_steps(got, peer.cfg.outer.num_inner_steps, peer.timing.t_step_s)
            # no entry round (`entry.py`): every view already counts this peer, by its old heartbeat,
            # and naming a later round would take it out of some views before others
            adopt_state(peer, got, skip)
            if against and self.penalties is not None:
                self.penalties.forgive(against)  # their values were out of bounds of the drifted state
                self.view.withdraw_votes(against)
            logger.info(
                "rejoined the swarm: round %d -> %d from %s, %d steps in", left, got.round, donor[-8:], skip
            )
            return left
        return None


class RegainSight:
    """A peer that lost sight of the swarm waits (once per loss, at most the heartbeat TTL) for its
    view to come back before training on alone.

    After a stall or a cut link the DHT routing is gone and the view empties; training alone then
    produces rounds that are discarded when the peer rejoins the majority (`Rejoin`), and short
    rounds can run the whole remaining schedule before the view refreshes. A last survivor pays
    one TTL once.
    """

    def __init__(self, view: SwarmView) -> None:
        self.view, self.waited = view, False

    def before_round(self) -> None:
        if not self.view.lost_sight():
            self.waited = False
            return
        if self.waited:
            return
        self.waited = True
        t0 = time.monotonic()
        live = self.view.wait_for(2, self.view.ttl_s)
        logger.info("lost sight of the swarm; waited %.1f s for it: %d live", time.monotonic() - t0, live)


def skipped_s(peer: Peer) -> float:
    """How far into its round a peer that skipped steps to catch up already is, in seconds."""
    return peer.skip_steps * (peer.timing.t_step_s or 0.0)


def trained_before(metrics_path: Path) -> bool:
    """This run directory holds rounds of an earlier life of this peer: it is rejoining its swarm."""
    return bool(read_log(metrics_path).rounds)
