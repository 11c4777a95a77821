"""Random groups derived from (seed, tag, round): no messages needed to agree on them (§2).

Every peer that sees the same live set computes the same partition, and the partition changes
every round. A remainder of one peer joins the last group, so nobody is left to average alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from p2p_trainer.exchange.interface import ALL


def group_seed(seed: int, tag: str, round: int, gossip_step: int = 0) -> int:
    digest = hashlib.sha256(f"{seed}/{tag}/{round}/{gossip_step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def partition(members: Sequence[str], group_size: int, seed: int) -> list[list[str]]:
    """Split `members` (sorted first, so order of discovery does not matter) into random groups."""
    ordered = sorted(members)
    if group_size == ALL or group_size >= len(ordered):
        return [ordered] if ordered else []
    perm = np.random.default_rng(seed).permutation(len(ordered))
    shuffled = [ordered[i] for i in perm]
    groups = [shuffled[i : i + group_size] for i in range(0, len(shuffled), group_size)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return groups


def group_of(member: str, members: Sequence[str], group_size: int, seed: int) -> tuple[int, list[str]]:
    """Index and members of the group that `member` belongs to."""
    for index, group in enumerate(partition(members, group_size, seed)):
        if member in group:
            return index, group
    raise ValueError(f"{member!r} is not among the members")
