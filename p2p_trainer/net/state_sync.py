"""Late join: download the current outer state (φ, m, round) from a live peer, verified.

The donor serves the snapshot taken at its last outer step (immutable lists of tensors, so no
copy is needed to stay consistent). The joiner checks the header, the sizes against its own model,
finiteness, and a sha256 of the payload; a failed donor is a value, and the caller tries another.
Nothing received is unpickled: a msgpack header and raw float32 bytes.

Several joiners arriving at once spread over the donors (`donor_order`: rendezvous hashing among
the peers at the swarm's latest rounds), and a transfer that stops making progress for
`stall_timeout_s` (donor killed, stalled or cut off mid-transfer) fails at once, so the joiner moves
on to the next donor instead of waiting out the whole download timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from hivemind.p2p import P2P, PeerID

from p2p_trainer.algo.methods import OuterState
from p2p_trainer.config import NetworkConfig
from p2p_trainer.exchange.interface import Failed
from p2p_trainer.fault_points import NO_FAULTS, FaultInjector
from p2p_trainer.net.serve_limits import ServeLimits
from p2p_trainer.net.transport import MAX_HEADER_BYTES, Transport, decode_header, encode_header, read_frame

logger = logging.getLogger(__name__)

STATE_PROTOCOL = "p2p-trainer/state/1"


@dataclass(frozen=True)
class StateSnapshot:
    anchor: list[torch.Tensor]
    momentum: list[torch.Tensor]
    round: int
    published_at: float = 0.0
    """time.monotonic() when the donor's round began (its previous outer step)."""
    step_s: float = 0.0
    """The donor's inner-step time (EMA, seconds); 0 when unknown."""


@dataclass
class DonorState(OuterState):
    """A downloaded outer state, with where the donor stood in its round when it arrived."""

    round_elapsed_s: float = 0.0
    """Seconds the donor had spent in this round by the time the payload arrived."""
    donor_step_s: float = 0.0
    """The donor's inner-step time; 0 when it did not know or say."""
    sha256: str = ""
    """Hash of the payload as received (what a second donor confirms)."""


def catch_up_steps(state: DonorState, num_inner_steps: int, own_step_s: float | None) -> int:
    """Inner steps a peer adopting `state` should leave out of its first round (0 … H−1).

    The donor ends this round after `H · donor_step − elapsed` more seconds; doing only the steps
    that fit in that time brings the joiner to the round's exchange with the donor's group. Without
    this a rejoined peer stays a part-round behind and a blocking group leaves it out every round.
    """
    donor_step = state.donor_step_s
    own_step = own_step_s if own_step_s and own_step_s > 0 else donor_step
    if donor_step <= 0 or own_step <= 0:
        return 0
    remaining_s = max(0.0, num_inner_steps * donor_step - state.round_elapsed_s)
    needed = math.ceil(remaining_s / own_step - 1e-9)
    return min(num_inner_steps - 1, max(0, num_inner_steps - needed))


def _payload(snapshot: StateSnapshot) -> bytes:
    flat = torch.cat(
        [t.detach().to("cpu", torch.float32).reshape(-1) for t in snapshot.anchor + snapshot.momentum]
    )
    return flat.numpy().tobytes()


class StateServer:
    """Serves this peer's latest outer-state snapshot to joiners."""

    def __init__(
        self,
        transport: Transport,
        run_id: str,
        faults: FaultInjector = NO_FAULTS,
        limits: ServeLimits | None = None,
    ) -> None:
        """`faults` is told ("serve", states served so far) halfway through each payload; `limits`
        bounds what senders can make this peer upload (None: no bound)."""
        self.transport, self.run_id, self.limits = transport, run_id, limits
        self.snapshot: StateSnapshot | None = None
        self._digested: tuple[StateSnapshot, int, str] | None = None
        """The last snapshot serialised, its payload's size and sha256: header-only requests (a
        joiner confirming a hash, or timing its download) then cost no serialisation."""
        self.faults = faults
        self.served = 0
        self.admits: Callable[[str], bool] = lambda _: True
        """Whether to serve a sender at all (a closed swarm serves only admitted peers)."""
        transport.run(transport.add_request_handler(STATE_PROTOCOL, self._serve), timeout_s=30)

    def publish(self, state: OuterState, step_s: float | None = None, elapsed_s: float = 0.0) -> None:
        """Serve `state` from now on: call it when a round begins (its anchor is that round's φ);
        `elapsed_s` is how far into the round this peer already is (it skipped steps to catch up)."""
        began = time.monotonic() - elapsed_s
        self._digested = None  # the last round's state is not held for its hash
        self.snapshot = StateSnapshot(
            list(state.anchor), list(state.momentum), state.round, began, step_s or 0.0
        )

    async def _serve(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.admits(sender):
            await P2P.send_raw_data(
                encode_header({"key": "state", "error": "not admitted to this swarm"}), writer
            )
            return
        request = decode_header(await read_frame(reader, MAX_HEADER_BYTES))
        snap = self.snapshot
        if request.get("run") != self.run_id or snap is None:
            await P2P.send_raw_data(encode_header({"key": "state", "error": "no state for this run"}), writer)
            return
        header_only = request.get("header_only") is True
        limited = self.limits.refusal(sender, header_only) if self.limits is not None else None
        if limited is not None:
            logger.info("state request of %s refused: %s", sender[-8:], limited)
            await P2P.send_raw_data(encode_header({"key": "state", "error": limited}), writer)
            return
        try:
            await self._send(snap, header_only, sender, writer)
        finally:
            if self.limits is not None and not header_only:
                self.limits.done()

    async def _send(
        self, snap: StateSnapshot, header_only: bool, sender: str, writer: asyncio.StreamWriter
    ) -> None:
        payload = b""
        digested = self._digested
        if digested is None or digested[0] is not snap or not header_only:
            payload = await asyncio.get_running_loop().run_in_executor(None, _payload, snap)
            digested = (snap, len(payload), hashlib.sha256(payload).hexdigest())
            if snap is self.snapshot:  # not one published over meanwhile
                self._digested = digested
        log = logger.debug if header_only else logger.info
        log("serving round-%d state (%d bytes) to %s", snap.round, digested[1], sender[-8:])
        header = {
            "key": "state",
            "round": snap.round,
            "nbytes": digested[1],
            "sha256": digested[2],
            "round_elapsed_s": time.monotonic() - snap.published_at,
            "step_s": snap.step_s,
        }
        await P2P.send_raw_data(encode_header(header), writer)
        if header_only:  # a joiner confirming another donor's state hash, or timing its download
            return
        # one length-prefixed frame (P2P.send_raw_data's framing), written in two halves so a fault
        # can strike mid-transfer; memoryview slices, so the state is not copied
        view, half = memoryview(payload), len(payload) // 2
        writer.write(len(payload).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER))
        writer.write(view[:half])
        await writer.drain()
        self.served += 1
        if self.faults.wants("serve", self.served):
            # p2pd forwards what it was given a moment later: wait, so a fault strikes mid-payload
            await asyncio.sleep(0.5)
            self.faults.reached("serve", self.served)
        writer.write(view[half:])
        await writer.drain()
        logger.info("served round-%d state (%d bytes) to %s", snap.round, len(payload), sender[-8:])


CHUNK_BYTES = 1 << 20


async def _read_payload(reader: asyncio.StreamReader, max_bytes: int, stall_timeout_s: float) -> bytes:
    """One length-prefixed frame, read in chunks; raises TimeoutError if a chunk stalls."""
    prefix = await asyncio.wait_for(reader.readexactly(P2P.HEADER_LEN), stall_timeout_s)
    size = int.from_bytes(prefix, P2P.BYTEORDER)
    if size > max_bytes:
        raise ValueError(f"state of {size} bytes exceeds the expected {max_bytes}")
    parts, left = [], size
    while left:
        part = await asyncio.wait_for(reader.readexactly(min(CHUNK_BYTES, left)), stall_timeout_s)
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


async def _fetch(
    transport: Transport,
    donor: str,
    run_id: str,
    nbytes: int,
    stall_timeout_s: float,
    header_only: bool = False,
) -> tuple[dict[str, object], bytes]:
    _, reader, writer = await transport.p2p.call_binary_stream_handler(
        PeerID.from_base58(donor), STATE_PROTOCOL
    )
    try:
        request = {"key": "state", "run": run_id, "header_only": header_only}
        await P2P.send_raw_data(encode_header(request), writer)
        header = decode_header(await asyncio.wait_for(read_frame(reader, MAX_HEADER_BYTES), stall_timeout_s))
        if "error" in header or header_only:
            return header, b""
        return header, await _read_payload(reader, nbytes, stall_timeout_s)
    finally:
        writer.close()


def heartbeat_lag_rounds(rounds_per_s: float, lag_s: float) -> int:
    """How far behind its donor a heartbeat's round may be: the rounds trained in `lag_s`, plus one.

    A view's copy of a heartbeat is up to two refresh periods old (stored once a period, read once a
    period), and short rounds pass many rounds in that time. Donors serve their current state, not
    the round their heartbeat shows, so counting such a donor as stale would only skew the order.
    """
    lag = max(0.0, rounds_per_s) * lag_s
    # the rate comes from other peers' heartbeats: an absurd one widens the order, never crashes it
    return 1 + math.ceil(min(lag, 1e9)) if math.isfinite(lag) else 1 + int(1e9)


def donor_order(me: str, donors: Sequence[tuple[str, int]], slack_rounds: int = 1) -> list[str]:
    """Peer ids to download from, best first: `donors` are (peer id, round) pairs.

    The donors within `slack_rounds` of the latest round come first, in an order hashed on
    (joiner, donor), so joiners arriving together ask different donors; the older ones follow.
    """
    others = [(pid, rnd) for pid, rnd in donors if pid != me and rnd > 0]
    if not others:
        return []
    latest = max(rnd for _, rnd in others)

    def rank(pid: str) -> str:
        return hashlib.sha256(f"{me}/{pid}".encode()).hexdigest()

    fresh = sorted((pid for pid, rnd in others if rnd >= latest - slack_rounds), key=rank)
    stale = [pid for pid, _ in sorted(others, key=lambda d: -d[1]) if pid not in fresh]
    return fresh + stale


def first_download(
    donors: Sequence[str], download: Callable[[str], DonorState | Failed]
) -> tuple[DonorState, str] | list[str]:
    """Try `donors` in order; the first verified state and its donor, or every donor's failure."""
    failures = []
    for donor in donors:
        got = download(donor)
        if isinstance(got, Failed):
            logger.warning("state download: %s; trying the next donor", got.reason.splitlines()[0])
            failures.append(got.reason)
            continue
        return got, donor
    return failures


def state_header(transport: Transport, donor: str, run_id: str, timeout_s: float) -> tuple[int, str] | Failed:
    """(round, sha256 of the payload) of the state `donor` serves now, without the payload."""
    header = _header(transport, donor, run_id, timeout_s)
    if isinstance(header, Failed):
        return header
    fields, digest = check_state_header(header, donor), header.get("sha256")
    if isinstance(fields, Failed):
        return fields
    if not isinstance(digest, str):
        return Failed(f"donor {donor[-8:]} sent no state hash: {str(header)[:200]}")
    return fields[0], digest


ROUND_POLLS = 10
"""Most header requests `await_state_round` makes: each costs the donor a tenth of a state in its
rate limit (`ServeLimits`), and the download that follows must still fit in it."""


def await_state_round(
    transport: Transport, donor: str, run_id: str, round: int, round_s: float, until: float, timeout_s: float
) -> int | None:
    """Wait until `donor` serves `round` or later, or time.monotonic() reaches `until`; the last
    round it named (None: it did not answer). Each answer says how far into its round the donor
    is, so with rounds of about `round_s` the next request is timed for the round's start, asked
    again halfway while far off (the pace drifts): a few requests, not a poll. A donor's answer is
    fresh where heartbeats lag by up to two view periods; it is one peer's claim, which only times
    the download (the caller bounds `until`, and the state is checked as any other)."""
    served: int | None = None
    least_s = max(0.02, round_s / 4)
    for ask in range(ROUND_POLLS):
        left_s = until - time.monotonic()
        if left_s <= 0:
            return served
        header = _header(transport, donor, run_id, min(timeout_s, left_s + least_s))
        fields = header if isinstance(header, Failed) else check_state_header(header, donor)
        if isinstance(fields, Failed):
            logger.info("waiting for round %d: %s", round, fields.reason.splitlines()[0])
            return served
        served, (elapsed_s, _) = fields
        if served >= round:
            return served
        ahead_s = (round - served) * round_s - elapsed_s
        # halved while far off and asks are left for the approach (very short rounds would
        # otherwise spend them all on the halving)
        far = ahead_s > 2 * round_s and ROUND_POLLS - ask > 4
        wait_s = ahead_s / 2 if far else ahead_s
        time.sleep(max(0.0, min(until - time.monotonic(), max(least_s, wait_s))))
    return served


def _header(transport: Transport, donor: str, run_id: str, timeout_s: float) -> dict[str, object] | Failed:
    """The header of the state `donor` serves now, without the payload."""
    try:
        header, _ = transport.run(_fetch(transport, donor, run_id, 0, timeout_s, header_only=True), timeout_s)
    except Exception as exc:  # any transport error: the donor cannot say
        return Failed(f"state header from {donor[-8:]} failed: {exc!r}")
    return header


def check_state_header(header: dict[str, object], donor: str) -> tuple[int, tuple[float, float]] | Failed:
    """A donor's state header: (round, (round_elapsed_s, step_s)), or why it cannot be used."""
    if "error" in header:
        return Failed(f"donor {donor[-8:]}: {str(header['error'])[:200]}")
    rnd = header.get("round")
    if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
        return Failed(f"donor {donor[-8:]} sent round {str(rnd)[:40]}")
    raw = [header.get("round_elapsed_s", 0.0), header.get("step_s", 0.0)]
    timing = [
        float(v)
        for v in raw
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e7
    ]
    if len(timing) != 2:
        return Failed(f"donor {donor[-8:]} sent round timing {str(raw)[:80]}; expected seconds >= 0")
    return rnd, (timing[0], timing[1])


def download_state(
    transport: Transport,
    donor: str,
    run_id: str,
    like: list[torch.Tensor],
    timeout_s: float,
    stall_timeout_s: float = NetworkConfig.state_stall_timeout_s,
) -> DonorState | Failed:
    """The donor's (φ, m, round), shaped like `like`, or `Failed(reason)`.

    Fails after `timeout_s` in all, or as soon as no bytes arrive for `stall_timeout_s`.
    """
    numel = sum(t.numel() for t in like)
    t0 = time.monotonic()
    try:
        header, payload = transport.run(
            _fetch(transport, donor, run_id, 8 * numel, stall_timeout_s), timeout_s
        )
    except Exception as exc:  # any transport error means: try another donor
        return Failed(f"download from {donor[-8:]} failed: {exc!r}")
    fields = check_state_header(header, donor)
    if isinstance(fields, Failed):
        return fields
    rnd, timing = fields
    if len(payload) != 8 * numel or header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return Failed(f"donor {donor[-8:]}: payload size or checksum mismatch")
    flat = torch.from_numpy(np.frombuffer(payload, dtype=np.float32).copy())
    if not bool(torch.isfinite(flat).all()):
        return Failed(f"donor {donor[-8:]} sent non-finite values")
    parts = list(torch.split(flat, [t.numel() for t in like] * 2))
    tensors = [p.view(t.shape) for p, t in zip(parts, like + like, strict=True)]
    return DonorState(
        anchor=tensors[: len(like)],
        momentum=tensors[len(like) :],
        round=rnd,
        sha256=str(header["sha256"]),  # checked against the payload above
        # the header's elapsed time was taken before the payload left: add the transfer
        round_elapsed_s=timing[0] + (time.monotonic() - t0),
        donor_step_s=timing[1],
    )
