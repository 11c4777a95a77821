"""The exchange interface: average tensors with a group of peers, as a value, never an exception.

Every method in docs/algorithms.md reduces its communication to one primitive: "average these tensors
with a group, blocking or in the background, with weights and a timeout". Backends implement
`Exchange`; the in-process backend (`inprocess.py`) and the hivemind backend (`net/`) plug into
the same methods and trainer. A failed exchange returns `Failed(reason)` and leaves the caller's
tensors untouched: results are always new tensors, never in-place edits of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from p2p_trainer.exchange.codecs import FLOAT32, Codec

ALL = 0
"""Group size meaning "every live peer" (an all-reduce)."""


@dataclass(frozen=True)
class Ok:
    """A completed exchange: `tensors` is the weighted group mean, in the caller's shapes/dtypes."""

    tensors: list[torch.Tensor]
    group_size: int
    """How many peers contributed (1 means the peer averaged with nobody)."""
    total_weight: float
    bytes_sent: int = 0
    bytes_received: int = 0
    elapsed_s: float = 0.0
    left_out: tuple[str, ...] = ()
    """Members (short ids) left out of some part: late past the grace window, dead or dropped."""
    own_parts: int = 0
    """Parts of the vector where this peer kept its own values (their result did not come back,
    or did not include this peer); 0 means every part is the exact weighted mean of its group."""
    late_parts: int = 0
    """Parts whose owner averaged without this peer's values (they came after it had moved on):
    evidence that this peer, not its partners, is behind the group."""
    quorum_s: float = 0.0
    """Time from the start of the exchange to its quorum (for the grace window's EMA, §4)."""
    sync_s: float = 0.0
    """Time from the end of the own part's averaging to the complete result."""
    arrival_s: float = 0.0
    """Time from the start of the exchange to the last contribution to this peer's part: the start
    skew plus the transfer, which the next grace window must cover (§4). The network backend also
    times contributions that came after the window, and reports them with its next result."""
    missed: int = 0
    """Members, not known to be gone, whose contribution to this peer's part did not arrive within
    its window: the window was too short for them (or they are stragglers)."""
    started_unix: float = 0.0
    """Wall-clock start (time.time()): a bench whose peers share one clock lines members up with it."""
    group_key: str = ""
    """The group's exchange key, the same for every member ("" where there is no group)."""
    rejected: tuple[str, ...] = ()
    """Members (short ids, also in `left_out`) whose contribution or result failed this peer's
    bounds (§10): left out of the merge and penalised."""
    agreed: bool = False
    """The request named a `state_digest` and every contribution this peer merged carried the
    same one: with a full merge, every member holds the state that digest describes."""
    reagree_asked: bool = False
    """Another member's contribution that this peer merged asked for a re-agreement
    (`ExchangeRequest.asks_reagree`): with a full merge every member merged every other's
    contribution, so all of them but the asker know it."""


@dataclass(frozen=True)
class Failed:
    """An exchange that did not complete; the peer carries on with its own tensors."""

    reason: str
    elapsed_s: float = 0.0
    missed: int = 0
    """As `Ok.missed`: members that were alive but late for this peer's part."""
    arrival_s: float = 0.0
    """As `Ok.arrival_s`, where something arrived (late contributions timed after the window)."""


ExchangeResult = Ok | Failed


@dataclass(frozen=True)
class ExchangeRequest:
    """What to average with whom. `tag` separates concurrent exchanges (e.g. "mix1" and "mix2")."""

    tag: str
    round: int
    group_size: int = 2
    """Target group size g; `ALL` (0) means all live peers."""
    weight: float = 1.0
    """This peer's weight w_j (docs/algorithms.md §5), e.g. the tokens behind its contribution."""
    timeout_s: float = 30.0
    """Upper bound on the whole exchange, matchmaking included. Nothing waits forever."""
    gossip_step: int = 0
    """For k consecutive gossip rounds within one outer round (Mix2's k2): 0, 1, ..."""
    quorum_fraction: float = 1.0
    """§4: proceed once ceil(fraction · group size) members (self included) have contributed."""
    quorum_wait_s: float = math.inf
    """Longest wait for that quorum (then merge whatever arrived); `timeout_s` bounds it too."""
    grace_s: float = 0.0
    """§4: after the quorum, wait at most this long for the rest of the group."""
    result_wait_s: float = math.inf
    """After the own part is averaged, wait at most `grace_s` plus this for the others' parts."""
    codec: Codec = FLOAT32
    """How the contributions are written on the wire (`codecs.py`; ExchangeConfig.update_codec)."""
    result_codec: Codec | None = None
    """How the part owners' averages are written back; None: as `codec`."""
    reference: tuple[torch.Tensor, ...] | None = field(default=None, compare=False, repr=False)
    """What the tensors are compared with (§10): their update is tensors − reference. `ZERO` for
    tensors that are themselves updates (Δ, gradients); the tensors this peer held before the
    round's training for models; None where nothing is known (only size, finiteness and weight are
    checked). Backends without untrusted members (in-process) ignore it."""
    weight_floor: float = math.inf
    """A weight any honest peer may claim whatever this peer's own (one full round's tokens where
    weights are tokens, 1 where they are all equal): the floor of the weight bound (§10); inf
    leaves only the backend's absolute bound."""
    state_digest: bytes = b""
    """A digest of state the caller holds besides the tensors (DiLoCo: φ, m and the round), sent
    with each contribution so that the result says whether every member's was the same
    (`Ok.agreed`); empty sends none."""
    asks_reagree: bool = False
    """This peer's φ and m may differ from the others' (an exchange of its did not merge fully):
    said with each contribution, so that every member starts a re-agreement with it next round
    (`Ok.reagree_asked`; docs/algorithms.md §1)."""
    divergent: bool = False
    """The tensors are states that may have drifted apart (a re-agreement), not one round's
    progress from a start the members share: a part owner's result is then not held to point
    along this peer's own last step (§10, "Checks at every member"), only to the bounds a mean of
    bounded contributions meets."""
    in_round: bool = True
    """The members are the peers in this round: a backend that knows the peers' rounds leaves out
    those too far from it to take part (`net/in_step.py`). False for an exchange that peers in
    different rounds meet in (the final agreement)."""

    @property
    def results(self) -> Codec:
        return self.codec if self.result_codec is None else self.result_codec


ZERO: tuple[torch.Tensor, ...] = ()
"""`ExchangeRequest.reference` of updates: compared with zero."""


class PendingExchange(Protocol):
    """A background exchange started with `Exchange.start`."""

    def done(self) -> bool: ...

    def result(self, timeout_s: float) -> ExchangeResult:
        """Wait at most `timeout_s` seconds; `Failed` if not done by then (the exchange is abandoned)."""
        ...


class Exchange(Protocol):
    """A peer's handle on the swarm's averaging. One per peer."""

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        """Block until the group mean is known, or `request.timeout_s` passes."""
        ...

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> PendingExchange:
        """Launch the same exchange in the background and return at once.

        The tensors are snapshotted (copied) before return, so the caller may keep training.
        """
        ...

    def num_live_peers(self) -> int:
        """Peers this one currently believes are alive, itself included."""
        ...

    def close(self) -> None: ...


def valid_weight(weight: float, max_weight: float = math.inf) -> bool:
    """docs/algorithms.md §5: weights from the network must be finite, > 0 and within what is possible."""
    return isinstance(weight, int | float) and math.isfinite(weight) and 0.0 < weight <= max_weight


def check_contribution(
    tensors: Sequence[torch.Tensor], like: Sequence[torch.Tensor], weight: float, max_weight: float = math.inf
) -> str | None:
    """Why a peer's contribution must be dropped, or None if it may be merged.

    Checked before anything reaches the model: count, shapes, dtypes, finiteness and weight bounds.
    """
    if not valid_weight(weight, max_weight):
        return f"weight {weight!r} is not finite, positive and <= {max_weight}"
    if len(tensors) != len(like):
        return f"{len(tensors)} tensors, expected {len(like)}"
    for i, (t, ref) in enumerate(zip(tensors, like, strict=True)):
        if t.shape != ref.shape:
            return f"tensor {i} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
        if t.dtype != ref.dtype:
            return f"tensor {i} has dtype {t.dtype}, expected {ref.dtype}"
        if not bool(torch.isfinite(t).all()):
            return f"tensor {i} has non-finite values"
    return None
