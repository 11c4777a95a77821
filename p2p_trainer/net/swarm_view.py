"""A peer's view of the swarm: it publishes its heartbeat and caches the live peers' heartbeats.

A background thread refreshes both every `period_s`; exchanges read the cached list, so forming
a group never waits on the DHT. A peer that misses `ttl_s` of heartbeats drops out of everyone's
view and of later groups. A peer that sees no one else any more (its link was cut, and its DHT
routing table emptied) pings the peers it knew and its bootstrap nodes until they answer again.

Heartbeats are not the only evidence of life. When exchanges fill the links, a heartbeat's DHT
store and the reads of it queue behind megabytes of tensors, and a busy peer's heartbeat could
expire in some views but not others: peers then form different groups and the exchange fails for
all of them (data-parallel peers on 10 Mbit/s links are the typical case).
So a peer whose messages reached this one within `ttl_s` stays in view (`hear_from`) unless it
left cleanly; a dead peer sends nothing, so it still drops out within `ttl_s`.

A death is known sooner than that. A peer whose sends to X failed (X refused the connection:
`health.py`) names X among the `suspects` of its heartbeat, and drops X from its own view at once;
every other peer drops X when it reads a heartbeat naming it that is more than 1.5 periods newer
than X's own latest heartbeat (X missed one), unless X's messages reached it within a period.
A heartbeat from X after the suspicion (X was restarted with its identity) brings it back
everywhere. Groups are derived from the views, so the survivors agree on the new member list
within about one heartbeat period instead of keeping a dead member's slot in their groups for
the whole TTL. A live peer named by mistake is back in view with its next heartbeat. Peers
still joining (round 0 in their heartbeat, once this one has trained a while) are left out too.

Only heartbeats signed by their own peer count (`envelope.py`), in a closed swarm only those of
admitted peers (`admission.py`; every `REVOCATION_EVERY` refreshes the view also republishes the
revocations it holds and learns those the others publish, `revocation.py`), and with the
security defences on the view believes them only within bounds relative to its own state
(`view_bounds.py`), and in an open swarm only peers it has seen alive (`probation.py`): every
consumer of `heartbeats()` (groups, alignment, donor choice, rejoin) sees that list.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from p2p_trainer import __version__
from p2p_trainer.config import NetworkConfig, SecurityConfig
from p2p_trainer.net import records, revocation
from p2p_trainer.net.admission import Admission, learn_published
from p2p_trainer.net.dht import NetNode
from p2p_trainer.net.entry import ENTRY_PERIODS, RoundPace, has_left, in_groups
from p2p_trainer.net.exclusion import STRIKES, Ballot, Vote, rounds_ahead, voted_out
from p2p_trainer.net.in_step import RoundHistory, out_of_step
from p2p_trainer.net.probation import Prober
from p2p_trainer.net.view_bounds import HeartbeatBounds, ReplayFilter, bound_heartbeats, median_round

logger = logging.getLogger(__name__)


@dataclass
class PeerStatus:
    """What this peer reports; the trainer updates it after every round."""

    round: int = 0
    tokens_processed: int = 0
    loss: float | None = None
    throughput_tokens_per_s: float = 0.0
    round_started: float = 0.0
    """DHT time when this peer began `round` (0: not yet)."""
    step: int = 0
    """Inner steps done over the run; this and the fields below are only shown (`status`)."""
    round_step: int = 0
    """Inner steps done in the current round."""
    round_steps: int = 0
    """Inner steps per round (0: not known yet)."""
    bytes_sent: int = 0
    """Bytes sent by this process's exchanges so far."""
    bytes_received: int = 0
    """Bytes received by them so far."""
    reachability: str = ""
    """What the start-up reachability check found (`records.REACHABILITY`; "": not yet run)."""
    last_exchange: str = ""
    """The worst outcome among the last round's exchanges (`round_log.EXCHANGE_OUTCOMES`)."""
    data_address: str = ""
    """Where this peer's direct data plane listens ("": it has none)."""
    enters_round: int = 0
    """The first round whose groups may count this peer (`entry.py`; 0: it started with the swarm)."""
    leaves_round: int = 0
    """The first round whose groups leave this peer out (`entry.py`; 0: none planned)."""


REVOCATION_EVERY = 5
"""Refreshes between two reads (and republications) of the swarm's revocations: they are rare,
so one DHT read and store every few periods carries them to every peer within a minute or so."""

REPORT_MARGIN_PERIODS = 1.5
"""How many heartbeat periods a suspect report must postdate the suspect's newest heartbeat."""

RECONNECT_LOG_S = 30.0
"""While no peer is in view, the ping results are logged when they change or this often."""


def at_round_zero(beats: list[records.Heartbeat], now: float, period_s: float) -> set[str]:
    """Peers whose heartbeat from the last two periods (`period_s` each) says round 0. An older
    round-0 heartbeat is the reader's lag, not news: a DHT store that waits out a stalled node
    holds up a view's refresh, and a view that kept what it read at a swarm's start would take
    every peer for one still joining."""
    return {h.peer_id for h in beats if h.round == 0 and h.timestamp >= now - 2 * period_s}


def reported_dead(beats: list[records.Heartbeat], self_id: str, now: float, margin_s: float) -> set[str]:
    """Peers named as suspects in a heartbeat more than `margin_s` newer than their own newest one
    (never this peer).

    A live peer publishes every period, so a report can postdate its newest heartbeat by about a
    period without any death: without the margin, a peer that one other peer cannot reach (a
    link it alone lost, a dial backoff) would flicker out of every view each time that peer
    republishes, and the views would disagree on the groups. A report counts from no later than
    this peer's clock, so a heartbeat stamped ahead (up to the clock skew the bounds allow) cannot
    evict a peer that keeps publishing.
    """
    latest = {h.peer_id: h.timestamp for h in beats}
    dead = set()
    for h in beats:
        said = min(h.timestamp, now)
        for peer in h.suspects:
            if peer != self_id and peer != h.peer_id and said > latest.get(peer, 0.0) + margin_s:
                dead.add(peer)
    return dead


class SwarmView:
    def __init__(
        self,
        node: NetNode,
        run_name: str,
        period_s: float = NetworkConfig.view_period_s,
        ttl_s: float = NetworkConfig.heartbeat_ttl_s,
        security: SecurityConfig | None = None,
        invitation: str = "",
        data_address: str = "",
        last_round: int | None = None,
    ) -> None:
        """`invitation`: this peer's, carried in its heartbeat (`admission.py`); `data_address`:
        where its direct data plane listens (`direct.py`); `last_round`: the run's number of
        rounds, the highest a heartbeat may claim (`view_bounds.py`)."""
        self.node, self.run_name = node, run_name
        self.invitation = invitation
        self.period_s, self.ttl_s = period_s, ttl_s
        sec = security or SecurityConfig()
        self.defences = sec.defences
        self.admission = Admission(sec, run_name)
        self._bounds = HeartbeatBounds(
            sec.round_window, sec.clock_skew_s, sec.max_throughput_tokens_per_s, last_round
        )
        self._replays = ReplayFilter(forget_after_s=ttl_s)
        self.status = PeerStatus(data_address=data_address)
        self._peers: list[records.Heartbeat] = []
        self._known: set[str] = set()
        self._reconnect_said: tuple[int, int] | None = None
        self._reconnect_said_at = 0.0
        self._last_live: set[str] = set()
        self._left: set[str] = set()
        self._refused: set[str] = set()
        """Peers whose newest heartbeat this view refused (not admitted, or out of bounds)."""
        self._heard: Callable[[float], set[str]] | None = None
        self._prober: Prober | None = None
        self._suspects: Callable[[], set[str]] = set
        self._sample: Callable[[PeerStatus], None] | None = None
        self._suspected_at: dict[str, float] = {}
        self._training_since: float | None = None
        """DHT time this peer first suspected each of its current suspects."""
        self._rounds = RoundHistory()
        self._last_out_of_step: set[str] = set()
        self._refreshes = 0
        self.refused_self: str | None = None
        """Why this swarm now refuses this very peer (an owner revoked it), or None."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pace = RoundPace()
        """The other peers' round starts as read, for the swarm's round time (`entry.py`)."""
        self._wake = threading.Event()
        """Set to publish the heartbeat now rather than at the end of the period."""
        self.ballot = Ballot()
        """The peers this one votes out of the groups (`exclusion.py`; only with the defences on)."""
        self._refresh()
        self._thread = threading.Thread(target=self._loop, name="swarm-view", daemon=True)
        self._thread.start()

    def _beat(self, leaving: bool = False) -> records.Heartbeat:
        st = self.status
        if self._sample is not None:
            try:
                self._sample(st)
            except Exception:  # a figure that is only shown must not cost the peer its heartbeat
                logger.exception("sampling this peer's progress for its heartbeat failed")
        # clamped to what `Heartbeat.decode` accepts, so an odd figure never costs the heartbeat
        round_steps = min(st.round_steps, records.MAX_ROUND_STEPS - 1)
        return records.Heartbeat(
            peer_id=self.node.peer_id,
            round=st.round,
            tokens_processed=st.tokens_processed,
            loss=st.loss,
            throughput_tokens_per_s=st.throughput_tokens_per_s,
            software_version=__version__,
            timestamp=records.now(),
            leaving=leaving,
            round_started=st.round_started,
            suspects=tuple(sorted(self._dead_here(self.heartbeats())))[: records.MAX_SUSPECTS],
            invitation=self.invitation,
            step=min(st.step, records.MAX_STEPS - 1),
            round_step=min(st.round_step, round_steps or records.MAX_ROUND_STEPS - 1),
            round_steps=round_steps,
            bytes_sent=min(st.bytes_sent, records.MAX_BYTES - 1),
            bytes_received=min(st.bytes_received, records.MAX_BYTES - 1),
            reachability=st.reachability,
            last_exchange=st.last_exchange,
            data_address=st.data_address,
            # a round from a config or a donor's claim, clamped like the counters above
            enters_round=min(st.enters_round, records.MAX_STEPS - 1),
            leaves_round=min(st.leaves_round, records.MAX_STEPS - 1),
            excludes=self._published_votes(),
        )

    def _read(self) -> tuple[list[records.Heartbeat], set[str], set[str]]:
        """The live peers' heartbeats, the peers that left (tombstones), and the peers whose
        heartbeats were refused (not admitted, or out of bounds if defences are on)."""
        now = records.now()
        read = records.read_heartbeats(self.node, self.run_name, verify=self.defences)
        beats = [beat for beat, expiration in read if expiration >= now or beat.leaving]
        published = {b.peer_id for b in beats}
        if not self.admission.open:  # a refused peer's claims (rounds included) count for nothing
            beats = [b for b in beats if self.admission.admits(b.peer_id, b.invitation)]
        if self.defences:
            st = self.status
            # a peer that stopped for its time bound keeps its last round: the others train on past
            # it, and it must not judge them by it
            own_round, own_started = (0, 0.0) if has_left(st, st.round) else (st.round, st.round_started)
            beats = bound_heartbeats(
                beats, own_round, now, self._bounds, self._replays, own_started, self.node.peer_id
            )
        refused = published - {b.peer_id for b in beats}
        return [b for b in beats if not b.leaving], {b.peer_id for b in beats if b.leaving}, refused

    def _refresh(self) -> None:
        turn, self._refreshes = self._refreshes, self._refreshes + 1
        try:
            records.publish_heartbeat(self.node, self.run_name, self._beat(), self.ttl_s, self.node.signer)
            peers, left, refused = self._read()
        except (records.RecordError, TimeoutError, RuntimeError) as exc:
            logger.warning("heartbeat refresh failed: %s", exc)
            return
        with self._lock:
            self._peers, self._left, self._refused = peers, left, refused
        self._pace.saw(self.heartbeats())  # the probed ones, where probation applies
        # after the heartbeat (a slow DHT call here must not let it expire in others' views) and
        # after the read (the admitted peers just read are the publishers to trust first)
        if self.admission.mode == "invitations" and turn % REVOCATION_EVERY == 0:
            try:
                self._share_revocations(turn // REVOCATION_EVERY)
            except (records.RecordError, TimeoutError, RuntimeError) as exc:
                logger.warning("sharing the swarm's revocations failed: %s", exc)
        others = {h.peer_id for h in self.heartbeats()} - {self.node.peer_id}
        self._known |= others
        if not others and self._known:
            self._reconnect()

    def _share_revocations(self, turn: int) -> None:
        """Learn the revocations the swarm published, republish those held (the `turn`-th share:
        a record carries a few, so successive shares rotate through them), and note if one names
        this peer (its heartbeats are then dropped by every peer that holds it)."""
        # the owners' own records first (`p2p-trainer revoke --initial-peers`), then the admitted peers'
        admitted = {h.peer_id for h in self.heartbeats()} | {self.node.peer_id} | self.admission.owners
        learn_published(self.admission, self.node, self.run_name, prefer=admitted)
        held = self.admission.revocations()
        if held:
            ttl_s = max(self.ttl_s, 3 * REVOCATION_EVERY * self.period_s)
            revocation.publish(self.node, self.run_name, held, ttl_s, self.node.signer, turn)
        if self.refused_self is None and self.admission.revoked_by(self.node.peer_id) is not None:
            self.refused_self = self.admission.refusal(self.node.peer_id, self.invitation)
            logger.error("this swarm now refuses this peer: %s", self.refused_self)

    def _reconnect(self) -> None:
        targets = sorted(self._known | set(self.node.bootstrap_ids()))
        try:
            answered = self.node.ping_peers(targets, timeout_s=self.period_s + 3)
        except (TimeoutError, RuntimeError) as exc:
            logger.info("no peer in view; pinging %d known peers failed: %s", len(targets), exc)
            return
        # refreshes come every half second while a peer waits for others: say it when the answer
        # changes, and otherwise every RECONNECT_LOG_S
        said = (answered, len(targets))
        if said != self._reconnect_said or time.monotonic() - self._reconnect_said_at > RECONNECT_LOG_S:
            logger.info("no peer in view; %d of %d known peers answered a ping", answered, len(targets))
            self._reconnect_said, self._reconnect_said_at = said, time.monotonic()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.period_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._refresh()
            except Exception:  # a view that stops refreshing would keep stale peers for the whole run
                logger.exception("heartbeat refresh failed unexpectedly; retrying next period")

    def heartbeats(self) -> list[records.Heartbeat]:
        with self._lock:
            beats = list(self._peers)
        if self._prober is None:
            return beats
        seen = self._prober.seen() | self._heard_unsuspected() | {self.node.peer_id}
        return [b for b in beats if b.peer_id in seen]

    def probe_with(
        self,
        probe: Callable[[str], Coroutine[Any, Any, bool]],
        submit: Callable[[Coroutine[Any, Any, bool]], concurrent.futures.Future[bool]],
        probed_by: Callable[[float], set[str]] = lambda _s: set(),
    ) -> None:
        """In an open swarm with the defences on, show only peers seen alive: sending messages
        to this one (`Transport.heard_within`), or answering `probe(peer)` run by `submit`
        (`probation.py`; peers in `probed_by(seconds)`, whose probes reached this one, are
        probed back at once); a closed
        swarm's view holds admitted peers only and needs no probes. Waits a few seconds for the
        peers in view."""
        if not (self.defences and self.admission.open):
            return
        self._prober = Prober(
            self._candidates,
            self._heard_unsuspected,
            lambda: probed_by(self.ttl_s),
            lambda: self._suspects(),
            probe,
            submit,
        )
        self._prober.start()

    def _candidates(self) -> set[str]:
        with self._lock:
            return {b.peer_id for b in self._peers} - {self.node.peer_id}

    def _heard_unsuspected(self) -> set[str]:
        """Peers whose messages arrived within `ttl_s`, less those a send to
        failed since (`share_suspects`)."""
        heard = self._heard(self.ttl_s) if self._heard is not None else set()
        return heard - self._suspects()

    def data_address(self, peer_id: str) -> str | None:
        """Where `peer_id`'s direct data plane listens, by its newest heartbeat in view."""
        for beat in self.heartbeats():
            if beat.peer_id == peer_id:
                return beat.data_address or None
        return None

    def hear_from(self, heard_within: Callable[[float], set[str]]) -> None:
        """Also count as live the peers `heard_within(ttl_s)` returns (those whose messages arrived)."""
        self._heard = heard_within

    def share_suspects(self, suspects: Callable[[], set[str]]) -> None:
        """Publish `suspects()` in the heartbeat and leave them out of this view."""
        self._suspects = suspects

    def sample_progress(self, sample: Callable[[PeerStatus], None]) -> None:
        """Call `sample(status)` before each heartbeat: figures that change within a round (inner
        steps, bytes) are read where they live, once a period, instead of pushed on every step."""
        self._sample = sample

    def live_peers(self) -> list[str]:
        beats = self.heartbeats()
        ids = {h.peer_id for h in beats}
        if self._heard is not None:
            # a refused heartbeat outweighs messages: a forger drawn into one group while its
            # heartbeat passed, and that sends, would otherwise stay in this view (and in its
            # groups) for good, and in no other peer's
            with self._lock:
                gone = self._left | self._refused
            ids |= self._heard(self.ttl_s) - gone
        dead, reported, joining = self._dead_here(beats), self.reported_dead(beats), self._joining(beats)
        live = sorted(ids - dead - reported - joining)
        if set(live) != self._last_live:
            logger.debug(
                "live view: %s (heartbeats %s; left out: suspects %s, reported dead %s, joining %s)",
                [p[-8:] for p in live],
                sorted(b.peer_id[-8:] for b in beats),
                sorted(p[-8:] for p in dead),
                sorted(p[-8:] for p in reported),
                sorted(p[-8:] for p in joining),
            )
            self._last_live = set(live)
        return live

    def enter_round(self, round: int) -> None:
        """This peer is in `round` from now on: reported in the next heartbeat, and remembered
        for judging which peers are out of step (`in_step.py`)."""
        now = records.now()
        self.status.round, self.status.round_started = round, now
        with self._lock:
            self._rounds.entered(round, now)

    def out_of_step(self) -> set[str]:
        """Live peers too many rounds ahead of this one to be drawn into its round's groups."""
        beats = self.heartbeats()
        with self._lock:
            out = out_of_step(beats, self._rounds, self.node.peer_id)
            changed, self._last_out_of_step = out != self._last_out_of_step, out
        if changed:
            rounds = {b.peer_id: b.round for b in beats}
            logger.info(
                "peers ahead of round %d, left out of its groups: %s",
                self.status.round,
                ", ".join(f"{p[-8:]}@r{rounds[p]}" for p in sorted(out)) or "none",
            )
        return out

    def enter_groups_at(self, round: int) -> None:
        """Count this peer in the groups of `round` and later rounds only (`entry.py`), and say so
        in a heartbeat published now: the others' views must read it before that round's
        exchanges."""
        self.status.enters_round = round
        self._wake.set()

    def leave_groups_at(self, round: int) -> None:
        """Leave this peer out of the groups of `round` and later rounds (`entry.py`), and say so
        in a heartbeat published now: the others' views must read it before that round's
        exchanges."""
        self.status.leaves_round = round
        self._wake.set()

    def round_s(self) -> float:
        """The swarm's round time as its peers' heartbeats show it (0: not seen yet)."""
        return self._pace.round_s(self.node.peer_id)

    def wait_for_pace(self, timeout_s: float) -> None:
        """Block until the swarm's round time is measured (`round_s`) or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while self.round_s() <= 0 and time.monotonic() < deadline and not self._stop.wait(0.2):
            pass

    def wait_for_round(self, round: int, min_s: float, timeout_s: float) -> bool:
        """Block at least `min_s` and until half or more of the other training peers' heartbeats
        show `round` or later (one peer's claim does not end the wait), or `timeout_s` passes;
        whether they did."""
        t0 = time.monotonic()
        me = self.node.peer_id

        def reached() -> bool:
            # peers still joining (round 0) or waiting to enter themselves do not say where the swarm is
            beats = self.heartbeats()
            rounds = [b.round for b in beats if b.peer_id != me and b.round > 0 and in_groups(b, b.round)]
            return bool(rounds) and 2 * sum(r >= round for r in rounds) >= len(rounds)

        while time.monotonic() - t0 < min_s or not reached():
            if time.monotonic() - t0 >= timeout_s or self._stop.wait(0.2):
                return reached()
        return True

    def outside_groups(self, round: int, beats: list[records.Heartbeat] | None = None) -> set[str]:
        """Peers, this one included, whose heartbeat (among `beats`, by default the view's) keeps
        them out of `round`'s groups: a later round named as the first that may count them, or
        `round` or an earlier one named as the first that leaves them out (`entry.py`); with the
        defences on, also the peers two others vote out of it (`exclusion.py`). This peer's own
        entry, exit and votes are its status, never the copy of its heartbeat read back from the
        DHT, which may be older."""
        me = self.node.peer_id
        beats = self.heartbeats() if beats is None else beats
        out = {b.peer_id for b in beats if b.peer_id != me and not in_groups(b, round)}
        if self.defences:
            out |= self.voted_out(round, beats)
        return out | {me} if not in_groups(self.status, round) else out

    def voted_out(self, round: int, beats: list[records.Heartbeat] | None = None) -> set[str]:
        """Peers, this one included, that two others vote out of `round`'s groups (`exclusion.py`)."""
        beats = self.heartbeats() if beats is None else beats
        # this peer's own votes as it publishes them, whatever round is asked about
        return voted_out(beats, round, self._published_votes(), self.node.peer_id)

    def _published_votes(self) -> tuple[Vote, ...]:
        # an ended vote stays published as long as it was named ahead: views a few rounds behind
        # this one may still be in its last rounds
        ahead = rounds_ahead(self.period_s, self.round_s(), ENTRY_PERIODS) or 0
        return self.ballot.votes(self.status.round - ahead)

    def _vote_first(self) -> int | None:
        """The first round a vote cast now may cover: one every view reads it before, counted from
        this peer's round or the others' median, whichever is later (this one may be behind)."""
        ahead = rounds_ahead(self.period_s, self.round_s(), ENTRY_PERIODS)
        if ahead is None:
            return None
        me = self.node.peer_id
        median = median_round(
            [b.round for b in self.heartbeats() if b.peer_id != me and in_groups(b, b.round)]
        )
        return max(self.status.round, median or 0) + ahead

    def vote_out(self, peer: str, strikes: float) -> None:
        """After an offence by `peer` (`Penalties.listen`): vote it out of the groups from a round
        every view reads the vote before, if it offended repeatedly (`exclusion.STRIKES`)."""
        if strikes < STRIKES or peer == self.node.peer_id:
            return
        first = self._vote_first()
        if first is None:
            logger.info("peer %s not voted out: the swarm's round time is not known yet", peer[-8:])
            return
        if self.ballot.vote(peer, first) is not None:
            self._wake.set()

    def withdraw_votes(self, peers: list[str]) -> None:
        """Take back this peer's votes against `peers` from a round every view reads that before
        (this peer adopted their state: it was the one that differed)."""
        first = self._vote_first()
        if first is not None:
            self.ballot.withdraw(peers, first)
            self._wake.set()

    def reported_dead(self, beats: list[records.Heartbeat] | None = None) -> set[str]:
        """Peers other peers' heartbeats report dead (`reported_dead`), less those whose messages
        reached this peer within a period: its own evidence outweighs another peer's report."""
        beats = self.heartbeats() if beats is None else beats
        heard = self._heard(self.period_s) if self._heard is not None else set()
        margin_s = REPORT_MARGIN_PERIODS * self.period_s
        return reported_dead(beats, self.node.peer_id, records.now(), margin_s) - heard

    def _joining(self, beats: list[records.Heartbeat]) -> set[str]:
        """Peers whose heartbeat still says round 0 (starting, or downloading the swarm's state
        after a restart) once this peer has trained for a few heartbeat periods: they cannot be
        in this round's exchanges, and a group waiting for them would only time out. Before
        that, round 0 is just the heartbeats' lag at the start of a swarm (`at_round_zero`: only
        a recent heartbeat says so)."""
        if self.status.round == 0:
            return set()
        now = time.monotonic()
        if self._training_since is None:
            self._training_since = now
        if now - self._training_since <= 3 * self.period_s:
            return set()
        return at_round_zero(beats, records.now(), self.period_s) - {self.node.peer_id}

    def _dead_here(self, beats: list[records.Heartbeat]) -> set[str]:
        """This peer's suspects that have not published a heartbeat since it suspected them: a
        peer restarted with the same identity is back in view with its first heartbeat."""
        suspects, now = self._suspects() - {self.node.peer_id}, records.now()
        with self._lock:
            for gone in set(self._suspected_at) - suspects:
                del self._suspected_at[gone]
            since = {p: self._suspected_at.setdefault(p, now) for p in suspects}
        latest = {h.peer_id: h.timestamp for h in beats}
        return {p for p in suspects if latest.get(p, 0.0) <= since[p]}

    def lost_sight(self) -> bool:
        """No other peer is in view, but some were before: this peer was stalled or cut off."""
        return bool(self._known) and not (set(self.live_peers()) - {self.node.peer_id})

    def wait_for(self, num_peers: int, timeout_s: float, count_left: bool = False) -> int:
        """Block until `num_peers` peers (self included) are live or the timeout passes; returns the
        live count. With `count_left`, peers whose tombstone is in view count as arrived: one that
        already finished its run (a short one, before this peer was up) will not come back, and
        waiting for it would only spend the whole timeout."""

        def live() -> set[str]:
            return set(self.live_peers()) | {self.node.peer_id}

        def arrived() -> set[str]:
            if not count_left:
                return live()
            with self._lock:
                left = set(self._left)
            return live() | left

        deadline = time.monotonic() + timeout_s
        while len(arrived()) < num_peers and time.monotonic() < deadline:
            self._refresh()
            time.sleep(0.5)
        return len(live())

    def close(self) -> None:
        """Stop heartbeating and withdraw: a tombstone replaces this peer's heartbeat record."""
        if self._prober is not None:
            self._prober.close()
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.period_s + 5)
        try:
            beat = self._beat(leaving=True)
            records.publish_heartbeat(self.node, self.run_name, beat, self.ttl_s, self.node.signer)
        except (records.RecordError, TimeoutError, RuntimeError) as exc:
            logger.warning("could not withdraw the heartbeat (it expires in %.0f s): %s", self.ttl_s, exc)
