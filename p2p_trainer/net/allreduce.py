"""Butterfly all-reduce of one flat float vector within a group, with a quorum and a grace window.

Member i owns part i of the vector. Phase 1: every member sends part j of its contribution (with
its weight) to member j. Each owner checks every contribution (size, finiteness, weight bounds,
and with defences on the update bounds of §10, `robust.py`) before it merges anything. Phase 2: owners send the averaged part, with the list of members it
includes, to every member. Per member and exchange, 2·(n−1)/n of the vector goes each way.

Bounded waiting (docs/algorithms.md §4). An owner averages its part once a quorum K of the group
(itself included) has contributed and then at most `grace_s` more; it stops waiting early for
members that are gone (suspect, out of the live view, or seen in the same exchange under another
view of the group). Without a quorum it gives up after `quorum_wait_s`. Contributions that come
later are left out of that round.

Phase 2 when an owner is dead or late: the design choice. A member waits for part j's result at
most `grace_s + result_wait_s` after its own part is done if j contributed to it (j was alive in
this exchange), and not at all if j did not (j is dead, stalled or late: its result would come
late or never). A part whose result did not come, or does not include this member's own
contribution, is filled with the member's *own* values, and the result is `Ok` with
`own_parts > 0` and the late members in `left_out`. So every part is either the exact weighted
mean of the members its owner lists, or this member's own values ("the late peer keeps its own
update", §4), and this is reported, never silent. We chose this over re-partitioning the dead
owner's part among the responsive members, which costs another round of messages and another
wait whose membership the members can again disagree on; a dead owner's part is one n-th of the
vector for one round, and the dead peer leaves the groups within the heartbeat TTL (sooner where a
failed send marks it suspect). If no other member's values reached any part, the result is
`Failed` and the caller's tensors are kept. The caller's tensors are never modified.

Robust merging (§10): a contribution outside the owner's bounds is treated like a late one, and a
result outside a member's bounds like one that did not come (own values); both name the member in
`left_out` and `rejected`. Members this peer has penalised are neither sent to nor waited for.

Sends run in the background and never hold the caller: a member that does not take its messages
(dead, stalled, cut off) costs at most the waits above. A send that fails marks the peer in the
`PeerHealth`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from p2p_trainer.exchange.codecs import FLOAT32, Codec, alignment
from p2p_trainer.exchange.interface import ExchangeResult, Failed, Ok
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.robust import Defence, PartChecks, merge
from p2p_trainer.net.transport import Message, Transport
from p2p_trainer.net.wire import check_message, send_with_retries

logger = logging.getLogger(__name__)

POLL_S = 0.2
"""How often a waiting owner re-checks whether the members it waits for are gone."""
_background: set[asyncio.Task[None]] = set()


def part_bounds(numel: int, n: int, align: int = 1) -> list[tuple[int, int]]:
    """n near-equal parts whose bounds are multiples of `align` (a codec's grid; the last part
    takes the remainder)."""
    units = -(-numel // align)
    base, extra = divmod(units, n)
    bounds, start = [], 0
    for j in range(n):
        size = base + (1 if j < extra else 0)
        end = min(numel, start + size * align)
        bounds.append((start, end))
        start = end
    return bounds


@dataclass(frozen=True)
class GroupSpec:
    key: str
    """Unique per exchange and member list: peers with different views never mix."""
    members: list[str]
    me: str
    max_weight: float = math.inf
    quorum: int = 0
    """K, self included; 0 means the whole group."""
    quorum_wait_s: float = math.inf
    grace_s: float = 0.0
    result_wait_s: float = math.inf
    view_prefix: str = ""
    """The key without the member-list digest: messages under it with another digest come from
    members with another view of this exchange's group."""
    codec: Codec = FLOAT32
    """How contributions are written (`exchange/codecs.py`); each message names its codec, and a
    receiver checks the payload against it."""
    result_codec: Codec = FLOAT32
    """How the owners' averaged parts are written back."""
    defence: Defence | None = None
    """The §10 bounds and penalties; None applies only the size, finiteness and weight checks."""
    excluded: frozenset[str] = frozenset()
    """Members this peer has penalised (§10): not sent to, not waited for, not merged."""
    asks_reagree: bool = False
    """Sent with each contribution ("ra"): this member wants a re-agreement next round."""
    state_digest: bytes = b""
    """Sent with each contribution ("sd"); the owner notes whether every merged one carried the
    same (`ExchangeRequest.state_digest`)."""


@dataclass
class _Arrivals:
    values: dict[int, tuple[np.ndarray, float]]
    quorum_s: float
    last_s: float = 0.0
    """Offset from the start of the last contribution that arrived."""
    missed: int = 0
    """Members still expected (not gone) when the window closed."""
    late: set[asyncio.Task[Message | None]] = field(default_factory=set)
    """Their pending reads, kept open to time their arrival."""
    received: int = 0
    """Payload bytes of the contributions that arrived (dropped ones included)."""
    rejected: set[int] = field(default_factory=set)
    """Members whose contribution arrived but failed the §10 bounds."""
    asked: bool = False
    """A merged contribution asked for a re-agreement ("ra" true; anything else is no)."""
    same_digest: bool = True
    """Every merged contribution carried this member's `state_digest` (a header field compared
    as sent: anything else, of any type, is a different one)."""


Verdict = Callable[[int, np.ndarray | str, float, int], str | None]
"""Why member j's values (a contribution or a result, with its weight and how many members that
weight covers) fail the §10 bounds, or None; given why its message was invalid instead, it
penalises j for that."""


async def _collect(
    transport: Transport,
    group: GroupSpec,
    me: int,
    expected: int,
    started: float,
    deadline: float,
    gone: Callable[[str], bool],
    on_late: Callable[[float], None] | None = None,
    verdict: Verdict | None = None,
) -> _Arrivals:
    """Phase 1 at the owner: contributions to part `me` until quorum + grace (or the quorum wait)."""
    n = len(group.members)
    need = (group.quorum or n) - 1  # other members needed for the quorum

    def key_of(member: str) -> str:
        return f"{group.key}|c|{me}|{member}"  # its contribution to this owner's part

    tasks = {
        asyncio.create_task(transport.mailbox.get(key_of(group.members[j]), deadline - time.monotonic())): j
        for j in range(n)
        if j != me and group.members[j] not in group.excluded
    }
    got: dict[int, tuple[np.ndarray, float]] = {}
    rejected: set[int] = set()
    quorum_s: float | None = None
    last_s, received, same_digest, asked = 0.0, 0, True, False
    end = min(deadline, started + group.quorum_wait_s)
    pending = set(tasks)
    while pending:
        waiting = [group.members[tasks[t]] for t in pending]
        other_view = transport.mailbox.senders_under(group.view_prefix, group.key + "|")
        # a contribution already here is taken whatever its sender's state now (suspected since,
        # or left): only the wait for the missing ones ends when their senders are gone
        possible = [
            m for m in waiting if transport.mailbox.has(key_of(m)) or (not gone(m) and m not in other_view)
        ]
        if quorum_s is None and (len(got) >= need or len(got) + len(possible) < need):
            quorum_s = time.monotonic() - started  # reached, or out of reach: the grace window starts
            end = min(deadline, time.monotonic() + group.grace_s)
        if not possible:
            break  # everyone still missing is gone
        timeout = end - time.monotonic()
        if timeout <= 0:
            break
        done, pending = await asyncio.wait(
            pending, timeout=min(timeout, POLL_S), return_when="FIRST_COMPLETED"
        )
        for task in done:
            j = tasks[task]
            msg = task.result()
            received += len(msg.payload) if msg is not None else 0
            checked = check_message(msg, expected, group.max_weight)
            if isinstance(checked, str):
                logger.warning(
                    "contribution of %s to %s dropped: %s", group.members[j][-8:], group.key, checked
                )
                if verdict is not None and msg is not None:
                    rejected.add(j)
                    verdict(j, checked, 0.0, 1)
            elif verdict is not None and (why := verdict(j, *checked, 1)) is not None:
                logger.warning("contribution of %s to %s rejected: %s", group.members[j][-8:], group.key, why)
                rejected.add(j)
            else:
                got[j] = checked
                last_s = time.monotonic() - started
                same_digest = same_digest and msg is not None and msg.header.get("sd") == group.state_digest
                asked = asked or (msg is not None and msg.header.get("ra") is True)
    other_view = transport.mailbox.senders_under(group.view_prefix, group.key + "|")
    late = {
        t for t in pending if not gone(group.members[tasks[t]]) and group.members[tasks[t]] not in other_view
    }
    watched = late if on_late is not None else set()
    for task in pending - watched:
        task.cancel()
    quorum_s = time.monotonic() - started if quorum_s is None else quorum_s
    return _Arrivals(got, quorum_s, last_s, len(late), watched, received, rejected, asked, same_digest)


async def _watch_late(
    late: set[asyncio.Task[Message | None]], started: float, deadline: float, on_late: Callable[[float], None]
) -> None:
    """Time the contributions that come after the window (they are not merged): how late a
    punctual member on a slow link really is, which the next window must cover (§4)."""
    done, pending = await asyncio.wait(late, timeout=max(0.0, deadline - time.monotonic()))
    for task in pending:
        task.cancel()
    if any(not t.cancelled() and t.exception() is None and t.result() is not None for t in done):
        on_late(time.monotonic() - started)


def _included(msg: Message, n: int, owner: int) -> list[int] | None:
    """The members an owner's result says it merged: distinct indices into the group, the owner
    (index `owner`) among them since it always merges its own values, or None. Their count
    decides how a member checks the result (§10), so a repeated index is refused."""
    members = msg.header.get("in")
    if not isinstance(members, list) or not all(type(i) is int and 0 <= i < n for i in members):
        return None
    return members if len(set(members)) == len(members) and owner in members else None


async def _result_part(
    transport: Transport, group: GroupSpec, j: int, size: int, until: float
) -> tuple[tuple[np.ndarray, list[int], float] | str, int]:
    """Owner j's averaged part, the members it includes and their total weight (or why it is
    unusable), and the payload bytes that came."""
    msg = await transport.mailbox.get(f"{group.key}|r|{j}|{group.members[j]}", until - time.monotonic())
    received = len(msg.payload) if msg is not None else 0
    n = len(group.members)
    checked = check_message(msg, size, n * group.max_weight)
    if isinstance(checked, str):
        return checked, received
    included = _included(msg, n, j) if msg is not None else None
    if included is None:
        return "has no valid list of included members", received
    return (checked[0], included, checked[1]), received


async def _gather_results(
    transport: Transport,
    group: GroupSpec,
    bounds: list[tuple[int, int]],
    out: np.ndarray,
    own: np.ndarray,
    contributed: set[int],
    own_done: float,
    deadline: float,
    verdict: Verdict | None = None,
) -> tuple[list[int], set[str], int, int, set[str]]:
    """Phase 2: write the other owners' averaged parts into `out` where they come back in time,
    and this member's `own` values where they do not.

    Waits `grace_s + result_wait_s` for owners that contributed to this member's part, not at all
    for the others. Returns the contributor count of each part received (1 for a part kept as own
    values), the short ids of members left out of some part, how many parts came back without
    this member's values (it was late for them), the payload bytes received, and the owners
    whose result failed this member's bounds (§10; their parts are kept as own values).
    """
    n, me = len(group.members), group.members.index(group.me)
    short = [m[-8:] for m in group.members]
    others = [j for j in range(n) if j != me]
    patient = min(deadline, own_done + group.grace_s + group.result_wait_s)
    waits = {
        j: asyncio.create_task(
            _result_part(
                transport, group, j, bounds[j][1] - bounds[j][0], patient if j in contributed else own_done
            )
        )
        for j in others
    }
    sizes, left_out, late, received, rejected = [], set(), 0, 0, set()
    for j, task in waits.items():
        got, nbytes = await task
        received += nbytes
        if group.members[j] in group.excluded:
            got = "is from a penalised member"
        elif isinstance(got, str) and nbytes and verdict is not None:
            verdict(j, got, 0.0, 1)
            rejected.add(short[j])
        elif not isinstance(got, str) and me in got[1] and verdict is not None:
            why = verdict(j, got[0], got[2], len(got[1]))
            if why is not None:
                got = f"fails this member's bounds ({why})"
                rejected.add(short[j])
        if isinstance(got, str) or me not in got[1]:
            late += not isinstance(got, str)  # it came back, averaged without this member
            why = got if isinstance(got, str) else "does not include this member's contribution"
            log = logger.warning if short[j] in rejected else logger.info
            log("part %d of %s from %s %s; keeping own values", j, group.key, short[j], why)
            left_out.add(short[j])
            sizes.append(1)
            if out is not own:
                a, b = bounds[j]
                out[a:b] = own[a:b]
            continue
        a, b = bounds[j]
        out[a:b] = got[0]
        sizes.append(len(got[1]))
        left_out.update(short[i] for i in others if i not in got[1])
    return sizes, left_out, late, received, rejected


def _finish_in_background(sends: list[asyncio.Task[Any]], transport: Transport, key: str) -> None:
    async def finish() -> None:
        await asyncio.gather(*sends, return_exceptions=True)
        transport.mailbox.discard(key)

    task = asyncio.create_task(finish())
    _background.add(task)
    task.add_done_callback(_background.discard)


async def butterfly_average(
    transport: Transport,
    group: GroupSpec,
    flat: torch.Tensor,
    weight: float,
    deadline: float,
    health: PeerHealth | None = None,
    gone: Callable[[str], bool] = lambda _: False,
    contributed: Callable[[], None] | None = None,
    on_late: Callable[[float], None] | None = None,
    reference: torch.Tensor | None = None,
    on_sent_late: Callable[[int], None] | None = None,
) -> ExchangeResult:
    """`contributed` (a fault-injection point for tests) runs once phase 1's sends are delivered;
    `on_late` gets the offset from the start at which contributions that missed the window arrived;
    `reference` is what `flat` is compared with (§10): None for none known, an empty tensor for zero;
    `on_sent_late` gets the payload bytes of sends acknowledged after the result was returned
    (`Ok.bytes_sent` counts those acknowledged before), so that no delivered byte goes uncounted."""
    started, started_unix = time.monotonic(), time.time()
    n, me = len(group.members), group.members.index(group.me)
    if group.defence is not None:
        penalties = group.defence.penalties
        group = dataclasses.replace(
            group,
            max_weight=min(group.max_weight, group.defence.max_weight(weight)),
            excluded=group.excluded | {m for m in group.members if m != group.me and penalties.excluded(m)},
        )
    bounds = part_bounds(flat.numel(), n, alignment(group.codec, group.result_codec))
    data = flat.detach().to(torch.float32).contiguous().numpy()
    # with a lossy codec this member's own part is merged as sent too, so its error feedback
    # (what the codec dropped) is exactly what the group did not get
    sent = group.codec.roundtrip(data) if group.codec.lossy else data
    others = [j for j in range(n) if j != me]
    reached = [j for j in others if group.members[j] not in group.excluded]
    short = [m[-8:] for m in group.members]
    checks = None
    if group.defence is not None:

        def decoded(values: np.ndarray) -> tuple[str, np.ndarray]:
            _, header, values = group.codec.encode(values)
            return str(header["dt"]), values

        checks = PartChecks(
            group.defence, group.members, me, group.key, data, reference, bounds, decoded, weight
        )

    delivered, returned = 0, False
    """Payload bytes the receivers have acknowledged so far (not those merely scheduled)."""

    async def deliver(j: int, header: dict[str, object], payload: bytes) -> bool:
        nonlocal delivered
        ok = await send_with_retries(transport, group.members[j], header, payload, deadline, health)
        if ok and returned and on_sent_late is not None:
            on_sent_late(len(payload))
        elif ok:
            delivered += len(payload)
        return ok

    def send(j: int, phase: str, part: int, payload: bytes, extra: dict[str, object]) -> asyncio.Task[bool]:
        header = {"key": f"{group.key}|{phase}|{part}", **extra}
        return asyncio.create_task(deliver(j, header, payload))

    def contribution(j: int) -> tuple[bytes, dict[str, object]]:
        a, b = bounds[j]
        payload, header, _ = group.codec.encode(data[a:b])
        digest = {"sd": group.state_digest} if group.state_digest else {}
        ask = {"ra": True} if group.asks_reagree else {}
        return payload, {"w": weight, "n": b - a, **header, **digest, **ask}

    lo, hi = bounds[me]
    sends = [send(j, "c", j, *contribution(j)) for j in reached]
    if contributed is not None:
        await asyncio.wait(sends, timeout=2.0)  # delivered (or a member is not taking them)
        contributed()

    def away(member: str) -> bool:
        return member in group.excluded or gone(member)

    accept = checks.contribution if checks is not None else None
    arrivals = await _collect(transport, group, me, hi - lo, started, deadline, away, on_late, accept)
    own_scale = checks.mine if checks is not None else None
    mean, total_w = merge(sent[lo:hi], weight, list(arrivals.values.values()), group.defence, own_scale)
    included = sorted([me, *arrivals.values])
    # every member, this owner included, keeps the values as sent: identical results group-wide
    k = group.result_codec.result_k(len(included))
    payload, header, mine = group.result_codec.encode(mean, k)
    result = {"w": total_w, "in": included, "n": hi - lo, **header}
    sends += [send(j, "r", me, payload, result) for j in reached]
    own_done = time.monotonic()

    # parts that do not come back keep this member's own values (as sent); a codec's round trip
    # in fresh memory is reused, one that may view the caller's values is not written to
    out = np.empty_like(sent) if np.may_share_memory(sent, data) else sent
    out[lo:hi] = mine
    # a rejected member is alive: its result is waited for (and checked) like a contributor's
    awaited = set(arrivals.values) | arrivals.rejected
    verify = checks.result if checks is not None else None
    sizes, left_out, late_parts, results_received, rejected = await _gather_results(
        transport, group, bounds, out, sent, awaited, own_done, deadline, verify
    )
    sizes.append(len(included))
    left_out |= {short[j] for j in others if j not in arrivals.values}
    rejected |= {short[j] for j in arrivals.rejected}
    finishing: list[asyncio.Task[Any]] = list(sends)
    if arrivals.late and on_late is not None:
        finishing.append(asyncio.create_task(_watch_late(arrivals.late, started, deadline, on_late)))
    _finish_in_background(finishing, transport, group.key)
    elapsed = time.monotonic() - started
    returned = True  # sends acknowledged from now on are reported through `on_sent_late`
    own_parts = sum(1 for s in sizes if s == 1)
    if max(sizes) == 1:
        return Failed(
            f"no member's values arrived within the grace window (left out: {sorted(left_out)}"
            + (f", rejected: {sorted(rejected)})" if rejected else ")"),
            elapsed,
            missed=arrivals.missed,
        )
    return Ok(
        [torch.from_numpy(out)],
        group_size=min(sizes),
        total_weight=total_w,
        bytes_sent=delivered,
        bytes_received=arrivals.received + results_received,
        elapsed_s=elapsed,
        left_out=tuple(sorted(left_out)),
        own_parts=own_parts,
        late_parts=late_parts,
        quorum_s=arrivals.quorum_s,
        sync_s=time.monotonic() - own_done,
        arrival_s=arrivals.last_s,
        missed=arrivals.missed,
        started_unix=started_unix,
        group_key=group.key,
        rejected=tuple(sorted(rejected)),
        agreed=bool(group.state_digest) and arrivals.same_digest,
        reagree_asked=arrivals.asked,
    )
