"""In-process exchange backend: N peers (threads) in one process, exact averaging, seeded groups.

This is the reference against which the network backend is compared: same interface, same group
derivation, exact weighted means, the same codecs (`codecs.py`). Bytes are reported as a butterfly
all-reduce would move them (hivemind's scheme): each member sends and receives (n−1)/n of the
contributions' bytes and (n−1)/n of the results' bytes in the request's codecs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from p2p_trainer.algo.groups import group_of, group_seed
from p2p_trainer.algo.outer import weighted_mean
from p2p_trainer.exchange.codecs import FLOAT32, Codec
from p2p_trainer.exchange.feedback import as_sent
from p2p_trainer.exchange.interface import ExchangeRequest, ExchangeResult, Failed, Ok, check_contribution

logger = logging.getLogger(__name__)

_Key = tuple[str, int, int]  # (tag, round, gossip_step)


@dataclass
class _Slot:
    members: list[str]
    contributions: dict[str, tuple[list[torch.Tensor], float]] = field(default_factory=dict)
    digests: dict[str, bytes] = field(default_factory=dict)
    asks: set[str] = field(default_factory=set)
    """Members whose contribution asked for a re-agreement."""
    arrived: set[str] = field(default_factory=set)
    fetched: set[str] = field(default_factory=set)
    result: ExchangeResult | None = None


class InProcessSwarm:
    """The shared meeting point of N in-process peers."""

    def __init__(self, num_peers: int, seed: int) -> None:
        self.seed = seed
        self.names = [f"peer{i}" for i in range(num_peers)]
        self.live = set(self.names)
        self._cond = threading.Condition()
        self._slots: dict[tuple[_Key, int], _Slot] = {}

    def exchange(self, peer_index: int) -> InProcessExchange:
        return InProcessExchange(self, peer_index)

    def leave(self, peer_index: int) -> None:
        """Mark a peer dead: later groups are formed without it, and groups waiting for it fail now."""
        with self._cond:
            self.live.discard(self.names[peer_index])
            self._cond.notify_all()

    def _post(self, name: str, tensors: list[torch.Tensor], request: ExchangeRequest) -> tuple[_Key, int]:
        key: _Key = (request.tag, request.round, request.gossip_step)
        seed = group_seed(self.seed, request.tag, request.round, request.gossip_step)
        with self._cond:
            index, members = group_of(name, sorted(self.live | {name}), request.group_size, seed)
            slot = self._slots.setdefault((key, index), _Slot(members=members))
            slot.contributions[name] = (tensors, request.weight)
            slot.digests[name] = request.state_digest
            if request.asks_reagree:
                slot.asks.add(name)
            slot.arrived.add(name)
            if slot.arrived >= set(slot.members):
                slot.result = self._reduce(slot, tensors, request.codec, request.results)
                slot.contributions.clear()  # the mean is all anyone needs now; free the copies
                self._cond.notify_all()
        return key, index

    def _reduce(
        self, slot: _Slot, like: list[torch.Tensor], codec: Codec = FLOAT32, results: Codec = FLOAT32
    ) -> ExchangeResult:
        """The group's mean as the network peers end with it: contributions as a lossy codec
        delivers them, the mean as the owners send it back (exchange/codecs.py)."""
        accepted: list[list[torch.Tensor]] = []
        weights: list[float] = []
        for name in slot.members:
            tensors, weight = slot.contributions[name]
            reason = check_contribution(tensors, like, weight)
            if reason is not None:
                logger.warning("dropping contribution of %s: %s", name, reason)
                continue
            accepted.append(as_sent(tensors, codec) if codec.lossy else tensors)
            weights.append(weight)
        if not accepted:
            return Failed("no valid contribution in the group")
        n = len(accepted)
        mean = weighted_mean(accepted, weights)
        if results.name != "float32":
            mean = as_sent(mean, results, results.result_k(n))
        numel = sum(t.numel() for t in like)
        k = results.result_k(n)
        moved = int((n - 1) / n * (codec.payload_bytes(numel) + results.payload_bytes(numel, k)))
        digests = set(slot.digests.values())
        return Ok(
            mean,
            group_size=n,
            total_weight=float(sum(weights)),
            bytes_sent=moved,
            bytes_received=moved,
            agreed=n == len(slot.members) and len(digests) == 1 and b"" not in digests,
        )

    def _wait(self, slot_key: tuple[_Key, int], name: str, deadline: float) -> ExchangeResult:
        with self._cond:
            while True:
                slot = self._slots.get(slot_key)
                if slot is None:
                    return Failed("result already collected")
                if slot.result is not None:
                    slot.fetched.add(name)
                    if slot.fetched >= set(slot.members):
                        del self._slots[slot_key]
                    if isinstance(slot.result, Ok) and slot.asks - {name}:
                        return dataclasses.replace(slot.result, reagree_asked=True)  # another asked
                    return slot.result
                missing = sorted(set(slot.members) - slot.arrived)
                gone = [m for m in missing if m not in self.live]
                if gone:
                    return Failed(f"{', '.join(gone)} left before contributing")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return Failed(f"timed out waiting for {', '.join(missing)}")
                self._cond.wait(remaining)


class _InProcessPending:
    def __init__(self, swarm: InProcessSwarm, slot_key: tuple[_Key, int], name: str, started: float) -> None:
        self.swarm, self.slot_key, self.name, self.started = swarm, slot_key, name, started

    def done(self) -> bool:
        with self.swarm._cond:
            slot = self.swarm._slots.get(self.slot_key)
            return slot is None or slot.result is not None

    def result(self, timeout_s: float) -> ExchangeResult:
        res = self.swarm._wait(self.slot_key, self.name, time.monotonic() + timeout_s)
        return _with_elapsed(res, time.monotonic() - self.started)


def _with_elapsed(res: ExchangeResult, elapsed_s: float) -> ExchangeResult:
    if isinstance(res, Ok):
        return dataclasses.replace(res, elapsed_s=elapsed_s)
    return Failed(res.reason, elapsed_s)


class InProcessExchange:
    """One peer's view of an `InProcessSwarm`; implements `Exchange`."""

    def __init__(self, swarm: InProcessSwarm, peer_index: int) -> None:
        self.swarm = swarm
        self._index = peer_index
        self.name = swarm.names[peer_index]

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> _InProcessPending:
        started = time.monotonic()
        snapshot = [t.detach().clone() for t in tensors]
        slot_key = self.swarm._post(self.name, snapshot, request)
        return _InProcessPending(self.swarm, slot_key, self.name, started)

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        return self.start(tensors, request).result(request.timeout_s)

    def num_live_peers(self) -> int:
        return len(self.swarm.live)

    def close(self) -> None:
        self.swarm.leave(self._index)
