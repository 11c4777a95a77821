"""Checks on recorded exchanges (`net/exchange_tap.py`): each member's result is its group's mean.

Every peer of a swarm records, for each exchange, the flat vector it sent with its weight and the
flat vector it got back. Records sharing an exchange key are one group seen from each member. A
member whose result merged every part (nobody left out, no own values kept) must hold the
weighted mean of all members' recorded contributions, recomputed here from those records alone:
this checks the exchange end to end (split, wire, weights, merge, reassembly) without trusting
anything it reports about itself except which parts it merged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from p2p_trainer.net.exchange_tap import TappedExchange, read_tapped

RTOL = 2.5e-7
"""Owners sum in float64 and round once to float32, in arrival order; the recomputation sums in
member order. Both are correct roundings of (nearly) the same float64 value: at most 1 ulp apart."""
ATOL = 1e-12
"""For results that are (nearly) zero, where a relative bound says nothing."""


@dataclass(frozen=True)
class CheckedGroup:
    """A group whose merged members were checked against the recomputed mean."""

    tag: str
    round: int
    gossip_step: int
    key: str
    weights: tuple[float, ...]
    """The members' recorded weights, in member order."""
    merged: int
    """Members whose result merged every part (each was checked)."""
    moved: bool
    """The mean differs from some member's contribution: the check was not of a no-op."""

    @property
    def weighted(self) -> bool:
        """The weights differ, so an unweighted mean would have failed the check."""
        return len(set(self.weights)) > 1


def tapped_by_key(exchanges: Iterable[TappedExchange]) -> dict[str, dict[str, TappedExchange]]:
    """{exchange key: {peer: its record}}; a peer records each exchange once."""
    groups: dict[str, dict[str, TappedExchange]] = defaultdict(dict)
    for t in exchanges:
        rec = t.record
        assert rec.peer not in groups[rec.group_key], f"{rec.peer[-8:]} recorded {rec.group_key} twice"
        groups[rec.group_key][rec.peer] = t
    return groups


def read_swarm(dirs: Iterable[Path]) -> list[TappedExchange]:
    return [t for d in dirs for t in read_tapped(d)]


def weighted_mean(vectors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    stacked = torch.stack([v.to(torch.float64) for v in vectors])
    w = torch.tensor(weights, dtype=torch.float64)
    return ((stacked * w[:, None]).sum(0) / w.sum()).to(torch.float32)


def _prefixed(prefix: str) -> Callable[[str], str]:
    return lambda text: f"{prefix}: {text}"


def check_group(key: str, by_peer: dict[str, TappedExchange]) -> CheckedGroup | None:
    """Assert that every fully merged member of this group holds the group's weighted mean.

    None where no member merged every part, or the group is a lone peer's.
    """
    first = next(iter(by_peer.values())).record
    members = first.members
    merged = [t for t in by_peer.values() if t.record.merged_all]
    if len(members) < 2 or not merged:
        return None
    for t in by_peer.values():  # the key hashes the member list, so one key means one list
        assert t.record.members == members, f"{key}: member lists differ"
        assert t.record.codec == "float32", "the recomputation assumes exact float32 contributions"
    # a result that merged every part had every member's contribution, so each of them recorded it
    missing = [m[-8:] for m in members if m not in by_peer]
    assert not missing, f"{key}: merged by {len(merged)} but no record from {missing}"
    ordered = [by_peer[m] for m in members]
    weights = [t.record.weight for t in ordered]
    mean = weighted_mean([t.sent for t in ordered], weights)
    reference = merged[0].result
    for t in merged:
        assert t.result is not None and reference is not None, f"{key}: an Ok record without its result"
        torch.testing.assert_close(
            t.result,
            mean,
            rtol=RTOL,
            atol=ATOL,
            msg=_prefixed(f"{key}: {t.record.peer[-8:]}'s result is not the group mean"),
        )
        assert abs(t.record.total_weight - sum(weights)) <= 1e-9 * sum(weights), (
            f"{key}: total weight {t.record.total_weight}, recorded weights sum to {sum(weights)}"
        )
        # every part comes from one owner, sent to all: members hold bit-identical results
        assert torch.equal(t.result, reference), f"{key}: members' results differ"
    moved = any(not torch.equal(t.sent, mean) for t in ordered)
    return CheckedGroup(first.tag, first.round, first.gossip_step, key, tuple(weights), len(merged), moved)


def check_swarm(dirs: Iterable[Path]) -> list[CheckedGroup]:
    """Check every group of the swarm's recorded exchanges; the groups checked."""
    checked = [check_group(key, by_peer) for key, by_peer in tapped_by_key(read_swarm(dirs)).items()]
    return [c for c in checked if c is not None]
