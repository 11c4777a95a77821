"""Robust merging (§10): a hostile member cannot poison an honest member's vector through the butterfly.

Three members over an in-memory transport; the hostile one runs the honest butterfly but rewrites
the messages it sends (contributions or, as a part owner, results), as a modified peer would. With
defences on, the honest members' results stay within their bounds and name the liar; with them
off, the same messages poison the result (which shows the attack is real).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch
from hivemind import DHT
from hivemind.p2p import P2P
from hivemind.utils.multiaddr import Multiaddr

from p2p_trainer.algo.methods import OuterState, RoundReport, build_method
from p2p_trainer.config import OuterConfig
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.exchange.interface import ZERO, ExchangeRequest, ExchangeResult, Ok
from p2p_trainer.net.allreduce import GroupSpec, butterfly_average, part_bounds
from p2p_trainer.net.robust import Defence, PartChecks, Penalties, Scale, check_result, merge
from p2p_trainer.net.stream_gate import StreamGate
from p2p_trainer.net.transport import Mailbox, Message, SenderQuota, Transport, encode_header
from tests.unit.fake_exchanges import Finished

SIZE = 60
HONEST = ("a", "b")


class Tampering:
    """In-memory transport; `attack` rewrites this member's outgoing messages of one phase."""

    def __init__(
        self, peer_id: str, net: dict[str, Tampering], attack: tuple[str, str, float] | None
    ) -> None:
        self.peer_id, self.net, self.attack = peer_id, net, attack
        self.mailbox = Mailbox()

    async def send(self, peer: str, header: dict[str, Any], payload: bytes = b"") -> None:
        await asyncio.sleep(0.001)
        phase = str(header["key"]).rsplit("|", 2)[1]
        if self.attack is not None and phase == self.attack[0]:
            what, factor = self.attack[1], self.attack[2]
            header = dict(header)
            values = np.frombuffer(payload, np.float32)
            if what == "values":
                values = values * factor
            else:  # an absurd weight behind a sign-flipped contribution
                values, header["w"] = -values, float(header["w"]) * factor
            payload = values.astype(np.float32).tobytes()
        self.net[peer].mailbox.put(f"{header['key']}|{self.peer_id}", Message(self.peer_id, header, payload))


def _updates(n: int) -> list[torch.Tensor]:
    """Honest updates of one round: a common direction plus each member's own noise."""
    gen = torch.Generator().manual_seed(3)
    common = torch.randn(SIZE, generator=gen)
    return [common + 0.7 * torch.randn(SIZE, generator=gen) for _ in range(n)]


async def _exchange(
    members: list[str], attack: tuple[str, str, float], defences: bool, penalties: dict[str, Penalties]
) -> dict[str, ExchangeResult]:
    net: dict[str, Tampering] = {}
    for m in members:
        net[m] = Tampering(m, net, attack if m == "h" else None)
    flats = dict(zip(members, _updates(len(members)), strict=True))

    async def one(me: str) -> ExchangeResult:
        defence = (
            Defence.of(SecurityConfig(), penalties.setdefault(me, Penalties(60.0))) if defences else None
        )
        spec = GroupSpec(
            key="run/mix2/0/0/abc",
            members=members,
            me=me,
            quorum_wait_s=2.0,
            grace_s=0.3,
            result_wait_s=0.5,
            view_prefix="run/mix2/0/0/",
            defence=defence,
        )
        return await butterfly_average(
            net[me],  # type: ignore[arg-type]
            spec,
            flats[me],
            1.0,
            time.monotonic() + 10,
            reference=torch.empty(0),  # Δ: compared with zero
        )

    results = await asyncio.gather(*(one(m) for m in members))
    return dict(zip(members, results, strict=True))


def _distance(res: ExchangeResult, own: torch.Tensor) -> float:
    assert isinstance(res, Ok)
    return float((res.tensors[0] - own).norm() / own.norm())


def _poisoned(res: ExchangeResult, own: torch.Tensor) -> bool:
    """Moved further than any honest merge may (§10), or turned against this member's update."""
    assert isinstance(res, Ok)
    cosine = float(torch.nn.functional.cosine_similarity(res.tensors[0], own, dim=0))
    return _distance(res, own) > SecurityConfig().result_ratio_max or cosine < 0


ATTACKS = {
    "scaled 1e3": ("c", "values", 1e3),
    "scaled 1e6": ("c", "values", 1e6),
    "flipped -10x": ("c", "values", -10.0),
    "absurd weight": ("c", "weight", 1e4),
    "owner flips its result -10x": ("r", "values", -10.0),
}


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=list(ATTACKS))
def test_hostile_member_is_left_out_and_the_honest_result_stays_bounded(
    attack: tuple[str, str, float],
) -> None:
    members = ["a", "b", "h"]
    penalties: dict[str, Penalties] = {}
    results = asyncio.run(_exchange(members, attack, True, penalties))
    own = dict(zip(members, _updates(3), strict=True))
    bounds = part_bounds(SIZE, 3)
    for m in HONEST:
        res = results[m]
        assert isinstance(res, Ok) and "h" in res.left_out and "h" in res.rejected, res
        assert penalties[m].excluded("h") and not penalties[m].excluded("a" if m == "b" else "b")
        # the honest owners' parts: the honest members' mean (all three where h lies only as owner)
        merged = [own[x] for x in (members if attack[0] == "r" else HONEST)]
        mean = torch.stack(merged).mean(dim=0)
        for j, (lo, hi) in enumerate(bounds[:2]):
            torch.testing.assert_close(res.tensors[0][lo:hi], mean[lo:hi], msg=f"part {j}")
        assert not _poisoned(res, own[m])


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=list(ATTACKS))
def test_without_defences_the_same_attack_poisons_the_result(attack: tuple[str, str, float]) -> None:
    members = ["a", "b", "h"]
    results = asyncio.run(_exchange(members, attack, False, {}))
    own = dict(zip(members, _updates(3), strict=True))
    for m in HONEST:
        res = results[m]
        assert isinstance(res, Ok) and not res.left_out and not res.rejected
        assert _poisoned(res, own[m])


def test_a_pair_with_a_liar_keeps_its_own_values_and_says_why() -> None:
    penalties: dict[str, Penalties] = {}
    results = asyncio.run(_exchange(["a", "h"], ("c", "values", 1e3), True, penalties))
    res = results["a"]
    # a's part rejected h's contribution (own values); h's part is the mean h owed a
    assert isinstance(res, Ok) and res.rejected == ("h",) and res.left_out == ("h",) and res.own_parts == 1
    assert penalties["a"].excluded("h")
    assert not _poisoned(res, _updates(2)[0])


def test_a_pair_whose_owner_lies_keeps_nothing_of_it() -> None:
    penalties: dict[str, Penalties] = {}
    results = asyncio.run(_exchange(["a", "h"], ("r", "values", -10.0), True, penalties))
    res = results["a"]
    # a's own part is the honest mean, h's part failed a's bounds and kept a's own values
    assert isinstance(res, Ok) and res.rejected == ("h",) and res.own_parts == 1
    assert not _poisoned(res, _updates(2)[0]) and penalties["a"].excluded("h")


def test_penalised_member_is_not_waited_for_nor_merged() -> None:
    members, penalties = ["a", "b", "h"], {m: Penalties(60.0) for m in ("a", "b")}
    for p in penalties.values():
        p.offend("h", "a bad round before")
    results = asyncio.run(_exchange(members, ("c", "values", 1.0), True, penalties))
    for m in HONEST:
        res = results[m]
        assert isinstance(res, Ok) and res.left_out == ("h",) and res.own_parts == 1
        assert res.elapsed_s < 1.0  # not the 2 s quorum wait: h is not expected


def test_penalty_decays_so_an_honest_peer_comes_back() -> None:
    now = [0.0]
    penalties = Penalties(half_life=10.0, clock=lambda: now[0])
    penalties.offend("p", "one bad round")
    assert penalties.excluded("p")
    now[0] = 9.0
    assert penalties.excluded("p")
    now[0] = 10.5  # one half-life: below one half
    assert not penalties.excluded("p")
    for _ in range(3):
        penalties.offend("p", "again")  # a score of 3 takes log2(6) ≈ 2.6 half-lives to fall below 1/2
    now[0] = 30.0
    assert penalties.excluded("p")
    now[0] = 37.0
    assert not penalties.excluded("p")


def test_weight_bound_floor_is_a_full_round() -> None:
    defence = Defence.of(SecurityConfig(), Penalties(1.0), weight_floor=1000.0)
    assert defence.max_weight(10.0) == 1500.0  # a joiner's short round still accepts full rounds
    assert defence.max_weight(2000.0) == 3000.0


@pytest.mark.parametrize("rule", ["trimmed", "centred-clip"])
def test_robust_means_resist_one_outlier_in_three(rule: str) -> None:
    own = np.ones(8)
    others = [(np.full(8, 1.2), 1.0), (np.full(8, 1e3), 1.0)]
    defence = Defence.of(SecurityConfig(robust_mean=rule), Penalties(1.0))  # type: ignore[arg-type]
    merged, total = merge(own, 1.0, others, defence, Scale.of(own, np.zeros(0), "f4"))
    assert total == 3.0 and float(np.abs(merged - 1.1).max()) < 1.0  # the plain mean would be ~334
    plain, _ = merge(own, 1.0, others, None)
    assert float(plain.mean()) > 300


def test_flood_from_one_sender_holds_a_bounded_amount() -> None:
    async def flood() -> Mailbox:
        box = Mailbox(quota=SenderQuota(max_bytes=1 << 20, max_messages=16))
        box.put("run/x|c|0|honest", Message("honest", {"key": "run/x|c|0"}, b"h" * 1000))
        blob = b"x" * (64 << 10)
        for i in range(2000):  # 125 MiB from one sender under unique keys nobody reads
            box.put(f"junk/{i}|flood", Message("flood", {"key": f"junk/{i}"}, blob))
        return box

    box = asyncio.run(flood())
    held_bytes, held_messages = box.held_by("flood")
    assert held_bytes <= 1 << 20 and held_messages <= 16
    assert box.held_by("honest") == (1000, 1)  # the flood displaced only the flooder's messages


class _Offline(Transport):
    """A transport whose daemon is never started: enough to drive its receiving side."""

    async def _start(self, dht: Any) -> Any:
        p2p = SimpleNamespace(
            peer_id=SimpleNamespace(to_base58=lambda: "me"),
            daemon_listen_maddr=Multiaddr("/unix/tmp/p2pt-no-daemon.sock"),  # never dialled
        )
        self.gate = StreamGate(cast(P2P, p2p))  # no protocol registered: it takes no stream
        return p2p


class _Writer:
    def close(self) -> None:
        return None


def _stream(sender: str, frames: list[bytes]) -> tuple[Any, asyncio.StreamReader]:
    reader = asyncio.StreamReader()
    for frame in frames:
        reader.feed_data(frame)
    return SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: sender)), reader


def _frame(data: bytes, claimed: int | None = None) -> bytes:
    return (len(data) if claimed is None else claimed).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + data


def test_streams_are_bounded_per_sender_and_in_time() -> None:
    security = SecurityConfig(stream_read_timeout_s=0.3, sender_open_streams=1)
    transport = _Offline(cast(DHT, None), max_payload_bytes=1 << 20, security=security)
    transport.accept_from = lambda peer: peer != "stranger"
    transport.view_wait_s = 0.2  # a stranger's stream is held this long before it is refused
    header = _frame(encode_header({"key": "run/x|c|0"}))

    async def drive() -> float:
        t0 = time.monotonic()
        stalled = _stream("slow", [header, _frame(b"x" * 10, claimed=1000)])  # never finishes
        second = _stream("slow", [header, _frame(b"y")])  # over its open-stream bound
        stranger = _stream("stranger", [header, _frame(b"z")])  # not in the live view
        friend = _stream("friend", [header, _frame(b"ok")])
        await asyncio.gather(
            *(
                transport._on_stream(info, reader, cast(asyncio.StreamWriter, _Writer()))
                for info, reader in (stalled, second, stranger, friend)
            )
        )
        return time.monotonic() - t0

    try:
        elapsed = transport.run(drive(), timeout_s=5)
        assert elapsed < 1.0  # the stalled stream was cut at its read timeout
        assert transport.refused == 3 and transport.messages_received == 1
        assert transport.mailbox.held_by("friend") == (2, 1) and transport.mailbox.held_by("slow") == (0, 0)
        assert transport.heard_within(60) == {"friend"}  # refused senders do not count as heard
    finally:
        transport.close()


def test_only_a_peer_that_sends_counts_as_heard_not_one_that_only_takes() -> None:
    # a host that takes every message and sends none (a member that never contributes) must not
    # stay live in the view of the peers whose groups it is drawn into by their own deliveries;
    # a peer whose uplink is full, whose own messages are late, stays live by deliveries to it
    # while it has sent within HEARD_MEMORY windows
    transport = _Offline(cast(DHT, None), max_payload_bytes=1 << 20, security=SecurityConfig())
    window = 0.2

    async def arrive(sender: str) -> None:  # the mailbox lives on the transport's loop
        transport._deliver(sender, {"key": f"run/x|c|{sender}"}, b"y")

    try:
        transport.run(arrive("busy"), timeout_s=5)
        time.sleep(1.5 * window)  # its last message is older than the window, not than 3 of them
        transport._sent("silent", b"x" * 10)  # deliveries, as every send path records them
        transport._sent("busy", b"x" * 10)
        transport.run(arrive("talker"), timeout_s=5)
        assert transport.heard_within(window) == {"talker", "busy"}
        assert transport.messages_sent == 2 and transport.bytes_sent == 20
        time.sleep(2 * window)  # busy's own message is now over 3 windows old
        transport._sent("busy", b"x")
        assert transport.heard_within(window) == set()
    finally:
        transport.close()


def test_a_sender_entering_the_view_meanwhile_is_taken_not_refused() -> None:
    # a peer that has just joined sends before this one's view has read its heartbeat; the stream
    # waits for the view instead of being closed (which its sender would take for a delivery)
    transport = _Offline(cast(DHT, None), max_payload_bytes=1 << 20, security=SecurityConfig())
    live: set[str] = set()
    transport.accept_from = lambda peer: peer in live

    async def drive() -> None:
        info, reader = _stream("joiner", [_frame(encode_header({"key": "run/x|c|0"})), _frame(b"hi")])
        asyncio.get_running_loop().call_later(0.3, live.add, "joiner")  # the next view refresh
        await transport._on_stream(info, reader, cast(asyncio.StreamWriter, _Writer()))

    try:
        transport.run(drive(), timeout_s=5)
        assert transport.mailbox.held_by("joiner") == (2, 1) and transport.refused == 0
    finally:
        transport.close()


def test_without_defences_streams_are_taken_from_anyone() -> None:
    transport = _Offline(cast(DHT, None), max_payload_bytes=1 << 20, security=SecurityConfig(defences=False))
    transport.accept_from = lambda peer: False

    async def drive() -> None:
        info, reader = _stream("stranger", [_frame(encode_header({"key": "k"})), _frame(b"z")])
        await transport._on_stream(info, reader, cast(asyncio.StreamWriter, _Writer()))

    try:
        transport.run(drive(), timeout_s=5)
        assert transport.mailbox.held_by("stranger") == (1, 1) and transport.refused == 0
    finally:
        transport.close()


class _Requests:
    """Records each request with the tensors it was for; averages with nobody."""

    def __init__(self) -> None:
        self.seen: list[tuple[ExchangeRequest, list[torch.Tensor]]] = []

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> Finished:
        self.seen.append((request, list(tensors)))
        return Finished(list(tensors))

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> Ok:
        return self.start(tensors, request).result(0.0)

    def num_live_peers(self) -> int:
        return 2

    def close(self) -> None:
        return None


def _rounds(method_name: str, rounds: int = 2, **outer: Any) -> tuple[list[OuterState], _Requests]:
    rec = _Requests()
    method = build_method(OuterConfig.for_method(method_name, **outer), rec, round_tokens=500.0)
    state = OuterState.from_params([torch.zeros(3), torch.ones(2)])
    states = []
    for _ in range(rounds):
        states.append(dataclasses.replace(state))
        method.begin_round(state, 100.0)
        params = [a + 0.1 for a in state.anchor]  # a round's training
        method.end_round(params, state, 100.0, RoundReport(state.round))
    return states, rec


def _same(got: tuple[torch.Tensor, ...] | None, want: list[torch.Tensor]) -> bool:
    return got is not None and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_updates_are_measured_against_zero_and_models_against_the_round_before() -> None:
    states, rec = _rounds("factored")
    mix1 = [(r, t) for r, t in rec.seen if r.tag == "mix1"]
    mix2 = [r for r, _ in rec.seen if r.tag == "mix2"]
    assert all(r.reference == ZERO and r.weight_floor == 500.0 for r in mix2)  # Δ
    assert _same(mix1[0][0].reference, mix1[0][1])  # round 0: the seed's anchors, the same everywhere
    assert _same(mix1[1][0].reference, states[0].anchor)  # then the anchor of the round before
    _, rec = _rounds("diloco")
    assert all(r.reference == ZERO for r, _ in rec.seen if r.tag == "outer")
    states, rec = _rounds("noloco")
    noloco = [r for r, _ in rec.seen if r.tag == "noloco"]
    assert all(_same(r.reference, s.anchor) for r, s in zip(noloco, states, strict=True))  # θ against φ


@pytest.mark.parametrize("defences", [True, False])
def test_an_owner_reversing_its_result_is_caught_by_direction(defences: bool) -> None:
    members = ["a", "b", "h"]
    penalties: dict[str, Penalties] = {}
    results = asyncio.run(_exchange(members, ("r", "values", -1.0), defences, penalties))
    own = dict(zip(members, _updates(3), strict=True))
    lo, hi = part_bounds(SIZE, 3)[2]
    mean = torch.stack(list(own.values())).mean(dim=0)
    for m in HONEST:
        res = results[m]
        assert isinstance(res, Ok)
        if defences:  # no larger than an honest disagreement, but pointing against the member's update
            assert res.rejected == ("h",) and res.own_parts == 1
            torch.testing.assert_close(res.tensors[0][lo:hi], own[m][lo:hi])
        else:
            torch.testing.assert_close(res.tensors[0][lo:hi], -mean[lo:hi])


def _pair_checks(own: np.ndarray, weight: float, defence: Defence) -> PartChecks:
    """This member's checks in a pair, its vector `own` twice over, against a zero reference."""
    return PartChecks(
        defence,
        ["me", "partner"],
        0,
        "k",
        np.concatenate([own, own]),
        torch.empty(0),
        part_bounds(2 * own.size, 2),
        lambda values: ("f4", values),
        weight=weight,
    )


def test_a_short_round_holds_a_full_rounds_update_to_a_longer_bound() -> None:
    own = np.full(4, 0.1)  # a joiner's first round: a tenth of the steps
    checks = _pair_checks(own, 100.0, Defence.of(SecurityConfig(), Penalties(1.0)))
    full = np.full(4, 1.0)  # ten times the joiner's update, behind ten times its tokens
    assert checks.contribution(1, full, 1000.0) is None
    assert checks.contribution(1, full, 100.0) is not None  # the same update behind a short round


def test_the_final_agreements_weights_do_not_stretch_the_bounds() -> None:
    """An early stopper counts 0.01 in the final mean (run/final_agreement.py): that says how
    recent its model is, not how far it moved, so the others' 100 times its weight must not
    loosen its bounds 100 times."""
    own = np.full(4, 0.1)
    full = np.full(4, 1.0)  # ten times this member's update
    for stretch, accepted in ((True, True), (False, False)):
        checks = _pair_checks(own, 0.01, Defence.of(SecurityConfig(), Penalties(1.0), stretch=stretch))
        assert (checks.contribution(1, full, 1.0) is None) == accepted, stretch


def test_a_robust_means_result_is_held_to_the_contribution_floor() -> None:
    """A trimmed mean of three or more may leave a member's own update out, so its honest result
    can point somewhat against that update; a weighted mean, to which the member gave a full
    round's update, cannot. A result reversed outright is refused under either rule."""
    own = np.zeros(8)
    own[0] = 1.0  # the update, against a zero reference
    scale = Scale.of(own, np.zeros(0), "f4")
    aside = np.zeros(8)
    aside[:2] = (-0.3, 0.95)  # cosine -0.3 with the own update, no further away than honest peers
    reversed_ = -own
    for rule, count, accepted in (("mean", 3, False), ("trimmed", 3, True), ("trimmed", 2, False)):
        defence = Defence.of(SecurityConfig(robust_mean=rule), Penalties(1.0))  # type: ignore[arg-type]
        assert (check_result(aside, scale, defence, count=count) is None) == accepted, (rule, count)
        assert check_result(reversed_, scale, defence, count=count) is not None, (rule, count)


def test_a_short_rounds_result_is_held_to_the_others_update_it_implies() -> None:
    """A member that did one step of a round its partner did whole gets a weighted mean along the
    partner's update, which may point slightly against its own one-step update: it keeps that
    result, and refuses one implying a reversed partner, whatever total weight the owner claims.
    A member that did a full round holds the result's own direction as well."""
    rng = np.random.default_rng(5)
    own = rng.standard_normal(64)  # one inner step
    partner = rng.standard_normal(64)
    partner -= (partner @ own) / (own @ own) * own + 0.1 * own  # slightly against the own update
    partner *= 10.0 * np.linalg.norm(own) / np.linalg.norm(partner)  # twenty steps
    scale = Scale.of(own, np.zeros(0), "f4")
    defence = Defence.of(SecurityConfig(), Penalties(1.0), weight_floor=20.0)
    honest = (own + 20.0 * partner) / 21.0
    assert float(honest @ own) < 0  # the result points (slightly) against the member's update

    def check(result: np.ndarray, share: float, direction: bool = False) -> str | None:
        return check_result(result, scale, defence, 20.0, 2, share, direction)

    assert check(honest, 1 / 21) is None
    assert check(honest, 1 / 21, direction=True) is not None
    assert check((own - 20.0 * own) / 21.0, 1 / 21) is not None  # the partner's update claimed -own
    # claiming a larger total weight (a smaller own share) does not make a reversal pass
    assert check(-0.5 * own, 1 / 60) is not None
    # nor claiming the result is (almost) this member's own values, to hide a large change
    assert check(own + 0.5 * partner, 0.99) is not None
    assert check(own, 1.0) is not None  # nothing left for the other members
    checks = _pair_checks(own, 1.0, defence)  # through the member's checks: share from the weights
    assert checks.result(1, honest, 21.0, 2) is None
    assert checks.result(1, (own - 20.0 * own) / 21.0, 21.0, 2) is not None
    full = _pair_checks(own, 20.0, defence)  # the same vectors behind a full round of its own
    assert full.result(1, honest, 40.0, 2) is not None


def test_an_owner_cannot_claim_more_members_than_it_merged() -> None:
    """The members a result names decide how it is checked (a robust mean of three or more is held
    to a lower floor), so an owner in a pair that repeats an index to claim three is refused."""
    from p2p_trainer.net.allreduce import _included

    def named(members: object, n: int, owner: int = 1) -> list[int] | None:
        return _included(Message("owner", {"key": "k", "in": members}, b""), n, owner)

    assert named([0, 1], 2) == [0, 1]
    assert named([1], 2) == [1]
    assert named([0], 2) is None  # an owner always merges its own values
    assert named([0], 2, owner=0) == [0]
    assert named([0, 1, 1], 2) is None
    assert named([0, True], 2) is None
    assert named([0, 2], 2) is None


def test_a_reagreements_result_is_not_held_to_the_own_last_steps_direction() -> None:
    """Re-agreement averages states that drifted apart: its honest mean points along the drift,
    which may be against this member's last outer step; only the bounds a mean of bounded
    contributions meets apply, and a reversed partner is still refused."""
    own = np.zeros(8)
    own[0] = 1.0  # the last outer step, against the previous state
    drift = np.zeros(8)
    drift[:2] = (-2.4, 1.6)  # the partner's state: one step along, drifted aside and back
    honest = (own + (own + drift)) / 2
    assert float(honest @ own) < 0
    for direction, accepted in ((True, False), (False, True)):
        defence = Defence.of(SecurityConfig(), Penalties(1.0), result_direction=direction)
        checks = _pair_checks(own, 1.0, defence)
        assert (checks.result(1, honest, 2.0, 2) is None) == accepted, direction
        assert checks.result(1, (own - 3.0 * own) / 2, 2.0, 2) is not None, direction


def test_a_results_total_weight_and_members_bound_what_it_may_stretch() -> None:
    """The total weight a result claims sets the stretch of every bound on it: more than its
    members could hold (each within this member's weight bound) is refused, so an owner cannot
    stretch the bounds, or pass for a short round's partner, by claiming weight."""
    own = np.zeros(8)
    own[0] = 1.0
    aside = np.zeros(8)
    aside[:2] = (-0.3, 0.95)  # cosine -0.3: refused from a full round's partner (the direction)
    defence = Defence.of(SecurityConfig(), Penalties(1.0), weight_floor=20.0)
    checks = _pair_checks(own, 20.0, defence)
    assert checks.result(1, own, 40.0, 2) is None  # an honest pair's total
    assert checks.result(1, own, 20.0 + 1.5 * 20.0, 2) is None  # the partner at the weight bound
    assert checks.result(1, own, 20.0 + 1.5 * 20.0 + 1.0, 2) is not None
    assert checks.result(1, aside, 50.0, 2) is not None
    short = _pair_checks(own, 1.0, defence)  # one step of twenty: the partner's round leads
    assert short.result(1, aside, 21.0, 2) is None
    assert short.result(1, aside, 1.0 + 1.5 * 20.0 + 1.0, 2) is not None
