"""Constant work per round (docs/algorithms.md §6, after ReCoVer): survivors take over the dead's quota.

The swarm targets `T = outer.target_tokens_per_round` tokens per outer round, i.e.
`M = T / tokens_per_micro_batch` micro-batches. Each live peer takes an equal share of M; the
remainder goes to the first peers in sorted-id order, so the shares of peers with the same view
add up to exactly M. The share is re-derived from the live set before every inner step, so a peer
that sees another vanish mid-round tops up with extra micro-batches (gradient accumulation) in its
remaining steps. A peer always runs its H inner steps with at least one micro-batch each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from p2p_trainer.config import RunConfig

logger = logging.getLogger(__name__)


def micro_batch_tokens(cfg: RunConfig) -> int:
    return cfg.data.batch_size * cfg.model.seq_len


def share_of(me: str, live: list[str], total_micro_batches: int) -> int:
    """This peer's micro-batches out of `total_micro_batches` split among `live` (self included)."""
    peers = sorted(set(live) | {me})
    base, extra = divmod(total_micro_batches, len(peers))
    return base + (1 if peers.index(me) < extra else 0)


class WorkQuota:
    """How many micro-batches the next inner step takes (fixed `grad_accum` when no target is set)."""

    def __init__(self, cfg: RunConfig, me: str, live_peers: Callable[[], list[str]] | None = None) -> None:
        self.cfg, self.me, self.live_peers = cfg, me, live_peers
        self.num_inner_steps = cfg.outer.num_inner_steps
        target = cfg.outer.target_tokens_per_round
        self.total_micro_batches = round(target / micro_batch_tokens(cfg)) if target else 0
        self.done = 0
        self.live = 1

    @property
    def enabled(self) -> bool:
        return self.total_micro_batches > 0 and self.live_peers is not None

    def begin_round(self, done: int = 0) -> None:
        """A new round; `done` micro-batches of it were done before (a round resumed mid-way)."""
        self.done = done

    def next_step(self, step_in_round: int) -> int:
        """Micro-batches for inner step `step_in_round` (0 … H−1) of this round."""
        if not self.enabled or self.live_peers is None:
            return self.cfg.inner.grad_accum
        live = self.live_peers()
        self.live = len(set(live) | {self.me})
        share = share_of(self.me, live, self.total_micro_batches)
        steps_left = self.num_inner_steps - step_in_round
        remaining = share - self.done
        k = max(1, -(-remaining // steps_left))  # ceil: top-ups land in the steps that remain
        self.done += k
        return k
