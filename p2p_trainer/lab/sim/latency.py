"""Exchange-time formulas (alpha-beta model): latency `alpha_s` per message, `bandwidth_Bps` per link.

A message of `b` bytes over one link costs `alpha + b / bandwidth`. With `B` the bytes of one
model-sized tensor set and `N` the peers taking part:

- ring all-reduce (reduce-scatter then all-gather, 2(N-1) sequential hops of B/N bytes):
      T_ring(N) = 2 (N - 1) alpha + 2 (N - 1) / N * B / bw          -> grows linearly in N
- tree all-reduce (binary tree reduce then broadcast of the whole tensor, not pipelined):
      T_tree(N) = 2 ceil(log2 N) (alpha + B / bw)                   -> grows as log2 N
- group average of g peers (NoLoCo's random groups; reduce-scatter + all-gather inside the group,
  as hivemind's butterfly all-reduce does):
      T_group(g) = 2 (g - 1) (alpha + B / (g bw))                    -> independent of N
  For g = 2: 2 alpha + B / bw, one model's worth each way.

A group is as fast as its slowest member: callers pass the group's minimum bandwidth and maximum
latency. Bytes sent per peer: ring 2 (N-1)/N B, tree 2B (inner nodes more), group 2 (g-1)/g B.
These are the formulas NoLoCo's latency argument rests on: random pairs stay flat while an
all-reduce grows with N (linearly for a ring in the latency term, as log N for a tree).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def ring_allreduce_s(num_peers: int, nbytes: float, bandwidth_Bps: float, alpha_s: float) -> float:
    """T_ring(N) = 2 (N-1) alpha + 2 (N-1)/N * B / bw; zero for a single peer."""
    n = max(num_peers, 1)
    return 2.0 * (n - 1) * alpha_s + 2.0 * (n - 1) / n * nbytes / bandwidth_Bps


def tree_allreduce_s(num_peers: int, nbytes: float, bandwidth_Bps: float, alpha_s: float) -> float:
    """T_tree(N) = 2 ceil(log2 N) (alpha + B / bw); zero for a single peer."""
    depth = int(np.ceil(np.log2(max(num_peers, 1))))
    return 2.0 * depth * (alpha_s + nbytes / bandwidth_Bps)


def group_average_s(
    group_size: int | NDArray[np.int64],
    nbytes: float,
    bandwidth_Bps: FloatArray | float,
    alpha_s: FloatArray | float,
) -> FloatArray:
    """T_group(g) = 2 (g-1) (alpha + B / (g bw)), vectorised over groups; zero when g = 1."""
    g = np.asarray(group_size, dtype=np.float64)
    return 2.0 * (g - 1.0) * (np.asarray(alpha_s) + nbytes / (np.maximum(g, 1.0) * np.asarray(bandwidth_Bps)))


def allreduce_s(kind: str, num_peers: int, nbytes: float, bandwidth_Bps: float, alpha_s: float) -> float:
    """Dispatch on the scenario's `allreduce` ("ring" or "tree")."""
    if kind == "tree":
        return tree_allreduce_s(num_peers, nbytes, bandwidth_Bps, alpha_s)
    return ring_allreduce_s(num_peers, nbytes, bandwidth_Bps, alpha_s)


def allreduce_bytes_per_peer(kind: str, num_peers: int, nbytes: float) -> float:
    """Bytes one peer sends in one all-reduce (ring: 2 (N-1)/N B; tree: about 2 B)."""
    n = max(num_peers, 1)
    if n == 1:
        return 0.0
    return 2.0 * nbytes if kind == "tree" else 2.0 * (n - 1) / n * nbytes


def group_bytes_per_peer(group_size: int, nbytes: float) -> float:
    """Bytes one peer sends in a group average of g: 2 (g-1)/g B."""
    return 2.0 * (group_size - 1) / max(group_size, 1) * nbytes
