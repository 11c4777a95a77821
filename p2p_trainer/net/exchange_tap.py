"""Test tool: record what each network exchange sent and what it returned, to check the mean offline.

A test that wants to prove an exchange did its job needs every member's contribution next to
every member's result, recorded where the peer stands, not reconstructed from the trainer's
state. `NetworkExchange` takes a tap at construction; the default, `NO_TAP`, records nothing and
costs nothing (the exchange does not even keep a reference to the snapshot for it). A
`RecordingTap` (`join --record-exchanges DIR`) writes one file per exchange, once the caller has
taken its result: `DIR/NNNNNN.safetensors` holds the flat float32 vector sent ("sent") and, for
an `Ok`, the flat vector returned ("result"); its metadata "record" is a JSON `TapRecord`. Files
are written atomically (a reader never sees half of one), capped at `max_records` per peer, and
nothing in them is pickled. On close it writes DIR/transport.json with the transport's message
counters, so a test can check that a peer sent no tensors at all.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save

from p2p_trainer.exchange.interface import ExchangeRequest, ExchangeResult, Ok
from p2p_trainer.net.transport import Transport
from p2p_trainer.train.atomic_files import atomic_write_bytes

logger = logging.getLogger(__name__)

TRANSPORT_FILE = "transport.json"


@dataclass(frozen=True)
class TapRecord:
    """One exchange as one peer took part in it."""

    peer: str
    """The recording peer's id."""
    tag: str
    """The request's tag ("outer", "noloco", "mix1", "mix2", "grad")."""
    round: int
    """The request's round (the inner step for "grad")."""
    gossip_step: int
    """The request's gossip step (Mix2's k2)."""
    group_key: str
    """The exchange key the peer derived: the same for every member that saw the same group."""
    members: tuple[str, ...]
    """The group's members as this peer derived them (itself included)."""
    weight: float
    """The weight this peer sent with its contribution (after the exchange's bound)."""
    codec: str
    """The request's codec for contributions (`exchange/codecs.py`)."""
    ok: bool
    """Whether the result was `Ok`."""
    reason: str = ""
    """A `Failed` result's reason."""
    group_size: int = 1
    """The result's smallest contributor count over the parts."""
    total_weight: float = 0.0
    """The result's total weight of this peer's own part."""
    own_parts: int = 0
    """Parts that kept this peer's own values."""
    left_out: tuple[str, ...] = ()
    """Members left out of some part (short ids)."""
    late_parts: int = 0
    """Parts averaged without this peer's values."""

    @property
    def merged_all(self) -> bool:
        """Every part is the mean over the whole group: nobody left out, no own values kept."""
        return self.ok and not self.own_parts and not self.left_out and self.group_size == len(self.members)


@dataclass(frozen=True)
class TappedExchange:
    """A record with its tensors, as read back."""

    record: TapRecord
    sent: torch.Tensor
    result: torch.Tensor | None


@dataclass(frozen=True)
class TransportCounters:
    """What a peer's transport moved over the exchange protocol, over its whole life."""

    messages_sent: int
    bytes_sent: int
    messages_received: int
    bytes_received: int
    direct_sent: int = 0
    """Of `messages_sent`, those that went over the direct data plane (`direct.py`)."""

    @classmethod
    def of(cls, transport: Transport) -> TransportCounters:
        return cls(
            transport.messages_sent,
            transport.bytes_sent,
            transport.messages_received,
            transport.bytes_received,
            transport.direct_sent,
        )


class ExchangeTap:
    """Records nothing (production); `RecordingTap` writes the records."""

    enabled = False

    def record(
        self,
        request: ExchangeRequest,
        key: str,
        members: list[str],
        weight: float,
        sent: torch.Tensor,
        result: ExchangeResult,
    ) -> None:
        """Called once per exchange with the flat vector sent and the flat result, when taken."""

    def close(self, counters: TransportCounters) -> None:
        """Called once when the peer leaves, with its transport's counters."""


NO_TAP = ExchangeTap()


class RecordingTap(ExchangeTap):
    """Writes each exchange's record to `directory`, the first `max_records` of them."""

    enabled = True

    def __init__(self, directory: Path, peer: str, max_records: int = 2000) -> None:
        self.directory, self.peer, self.max_records = directory, peer, max_records
        self._count = 0
        self._lock = threading.Lock()  # Mix1's result and the blocking exchanges come from one thread,
        # but nothing in the interface promises that
        directory.mkdir(parents=True, exist_ok=True)

    def record(
        self,
        request: ExchangeRequest,
        key: str,
        members: list[str],
        weight: float,
        sent: torch.Tensor,
        result: ExchangeResult,
    ) -> None:
        with self._lock:
            if self._count >= self.max_records:
                return
            self._count += 1
            seq = self._count
        rec = TapRecord(
            self.peer,
            request.tag,
            request.round,
            request.gossip_step,
            key,
            tuple(members),
            float(weight),
            request.codec.name,
            ok=isinstance(result, Ok),
        )
        tensors = {"sent": sent.detach().to(torch.float32).contiguous()}
        if isinstance(result, Ok):
            rec = dataclasses.replace(
                rec,
                group_size=result.group_size,
                total_weight=float(result.total_weight),
                own_parts=result.own_parts,
                left_out=tuple(result.left_out),
                late_parts=result.late_parts,
            )
            # a lone peer's result is its snapshot itself; safetensors refuses shared storage
            tensors["result"] = result.tensors[0].detach().to(torch.float32).clone()
        else:
            rec = dataclasses.replace(rec, reason=result.reason)
        data = save(tensors, metadata={"record": json.dumps(dataclasses.asdict(rec))})
        atomic_write_bytes(self.directory / f"{seq:06d}.safetensors", data)

    def close(self, counters: TransportCounters) -> None:
        text = json.dumps(dataclasses.asdict(counters))
        atomic_write_bytes(self.directory / TRANSPORT_FILE, text.encode())


def open_tap(directory: Path | None, peer: str) -> ExchangeTap:
    """A recording tap writing to `directory`, or `NO_TAP` without one."""
    return NO_TAP if directory is None else RecordingTap(directory, peer)


def read_tapped(directory: Path) -> list[TappedExchange]:
    """Every record in `directory`, in the order the peer took the results."""
    out = []
    for path in sorted(directory.glob("[0-9]*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["record"])
            keys = set(f.keys())
            sent = f.get_tensor("sent")
            result = f.get_tensor("result") if "result" in keys else None
        for name in ("members", "left_out"):
            meta[name] = tuple(meta[name])
        out.append(TappedExchange(TapRecord(**meta), sent, result))
    return out


def read_counters(directory: Path) -> TransportCounters:
    """The transport counters a recording peer wrote when it left."""
    return TransportCounters(**json.loads((directory / TRANSPORT_FILE).read_text()))
