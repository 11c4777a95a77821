"""A joiner's checks on a donor's state before adopting it (with the security defences on).

A donor chosen from heartbeats can lie about its round and serve any state with a matching hash,
since it supplies the hash itself. So the joiner:

- refuses a state whose round is at or past the run's last round, or far above the median round
  of the live peers (`round_window`): a forged round would end its training at once;
- refuses a state its caller's `check_state` refuses (the joiner's validation loss of it,
  `run/entry_paths.py: StateLossCheck`), whatever its round and whoever confirms it;
- asks a second donor (the next in the download order) for the hash of the state it serves; the
  same round and hash confirm the first donor's state. Peers of gossip methods hold slightly
  different states, so a different hash is followed by the second donor's full state, and the two
  must agree to within `tolerance` (relative L2 distance of φ); a state that disagrees is refused
  and the next donor is tried in its place;
- says in the log when no second donor was available (none in view, or the others failed), so
  the state could not be confirmed.

The outer momentum m comes with the state, and neither the loss check nor the distance of φ looks
at it: a donor serving an honest φ with m scaled a thousandfold passes both, and the joiner's
first outer step (φ − α(Δ + βm)) throws its model away. So m is taken only as far as another
donor backs it: whole where a witness served the same hash (the same m); where the witness's state
differs (gossip peers), the smaller of the two donors' m by norm, so a liar on either side can make
it smaller and never larger than an honest peer's; and not at all (zero, as a new run's) where no
second donor was available. A peer rejoining by download (`entry_paths.Rejoin`) takes it whole up
to a few times the norm of its own (`bounded_momentum`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

import torch

from p2p_trainer.exchange.interface import Failed
from p2p_trainer.net.state_sync import DonorState

logger = logging.getLogger(__name__)

Download = Callable[[str], DonorState | Failed]
Header = Callable[[str], tuple[int, str] | Failed]


def round_refusal(rnd: int, median: int | None, last_round: int, window: int) -> str | None:
    """Why a donor's round cannot be right, or None if it may be."""
    if rnd >= last_round:
        return f"round {rnd} is at or past the run's last round {last_round}"
    if median is not None and rnd > median + window:
        return f"round {rnd} is more than {window} rounds above the live peers' median {median}"
    return None


def distance(a: DonorState, b: DonorState) -> float:
    """‖φa − φb‖ / ‖φb‖ over all tensors (inf when the shapes differ)."""
    if [t.shape for t in a.anchor] != [t.shape for t in b.anchor]:
        return float("inf")
    diff = sum(float(torch.sum((x - y) ** 2)) for x, y in zip(a.anchor, b.anchor, strict=True))
    norm = sum(float(torch.sum(y**2)) for y in b.anchor)
    return (diff / max(norm, 1e-30)) ** 0.5


def _norm(tensors: Sequence[torch.Tensor]) -> float:
    return sum(float(torch.sum(t.double() ** 2)) for t in tensors) ** 0.5


def backed_momentum(theirs: list[torch.Tensor], backer: list[torch.Tensor]) -> list[torch.Tensor]:
    """The smaller of two outer momenta by norm: `theirs` (a donor's) as far as `backer` (another
    donor's) backs it; a non-finite one counts as larger than any, and
    with neither finite there is none (zero)."""
    a, b = (n if math.isfinite(n) else math.inf for n in (_norm(theirs), _norm(backer)))
    if math.isinf(a) and math.isinf(b):
        return [torch.zeros_like(t) for t in theirs]
    return theirs if a <= b else backer


REJOIN_MOMENTUM_RATIO = 4.0
"""How many times the norm of its own outer momentum a rejoining peer takes from a donor whole."""


def bounded_momentum(
    theirs: list[torch.Tensor], own: list[torch.Tensor], ratio: float = REJOIN_MOMENTUM_RATIO
) -> list[torch.Tensor]:
    """`theirs` (a donor's) whole if its norm is at most `ratio` times `own`'s, else scaled down to
    that norm, its direction kept; zero if it is not finite. A rejoining DiLoCo peer must take the
    swarm's momentum as it is (the peers apply one outer step with one m), so it is not replaced by
    the smaller one as a joiner's is; a liar's thousandfold m is cut to a few honest ones."""
    a, b = _norm(theirs), _norm(own)
    if not math.isfinite(a):
        return [torch.zeros_like(t) for t in theirs]
    limit = ratio * b if math.isfinite(b) else 0.0
    if a <= limit:
        return theirs
    return [t * (limit / a) for t in theirs]


def agrees(
    state: DonorState, witness: str, header: Header, download: Download, tolerance: float
) -> bool | None:
    """Whether `witness` confirms `state`: True, False, or None if the witness could not answer.
    Where the witness's state differs from `state` but confirms it, `state` keeps the smaller of
    the two outer momenta (see the module's docstring)."""
    said = header(witness)
    if isinstance(said, Failed):
        logger.warning("state check: %s", said.reason.splitlines()[0])
        return None
    if said == (state.round, state.sha256):
        return True
    other = download(witness)
    if isinstance(other, Failed):
        logger.warning("state check: %s", other.reason.splitlines()[0])
        return None
    gap = distance(state, other)
    backed = backed_momentum(state.momentum, other.momentum) if gap <= tolerance else state.momentum
    if backed is not state.momentum:
        logger.info(
            "state check: outer momentum of norm %.4g taken for the donor's %.4g (witness %s: %.4g)",
            _norm(backed),
            _norm(state.momentum),
            witness[-8:],
            _norm(other.momentum),
        )
        state.momentum = backed
    logger.info(
        "state check: witness %s serves round %d (ours %d), relative distance %.3g (tolerance %.3g)",
        witness[-8:],
        other.round,
        state.round,
        gap,
        tolerance,
    )
    return gap <= tolerance


def confirmed_download(
    donors: Sequence[str],
    download: Download,
    header: Header,
    check_round: Callable[[int], str | None],
    tolerance: float,
    check_state: Callable[[DonorState, str], str | None] = lambda _state, _donor: None,
) -> tuple[DonorState, str] | list[str]:
    """Try `donors` in order; the first state with a plausible round and contents (`check_state`:
    None, or why the state is refused) that another donor confirms (or that no other donor could
    check), and its donor; else every donor's failure.

    Two donors that disagree are never asked to judge each other again: a third decides, and
    without one neither state is adopted.
    """
    failures: list[str] = []
    unreachable: set[str] = set()
    disputes: set[frozenset[str]] = set()
    for donor in donors:
        got = download(donor)
        arrived = time.monotonic()
        refusal = None if isinstance(got, Failed) else check_round(got.round) or check_state(got, donor)
        if isinstance(got, Failed) or refusal is not None:
            reason = got.reason if isinstance(got, Failed) else f"donor {donor[-8:]}: {refusal}"
            logger.warning("state download: %s; trying the next donor", reason.splitlines()[0])
            failures.append(reason)
            unreachable.add(donor)
            continue
        verdict = _judged(got, donor, donors, unreachable, disputes, header, download, tolerance)
        if verdict is None:
            # the donor's round went on while its state was checked and the witness answered: the
            # catch-up counts that too
            got.round_elapsed_s += time.monotonic() - arrived
            return got, donor
        failures.append(verdict)
    return failures


def _judged(
    got: DonorState,
    donor: str,
    donors: Sequence[str],
    unreachable: set[str],
    disputes: set[frozenset[str]],
    header: Header,
    download: Download,
    tolerance: float,
) -> str | None:
    """None to adopt `got` (confirmed, or nobody could check it), else why it is refused."""
    disputed = any(donor in pair for pair in disputes)
    for witness in donors:
        if witness == donor or witness in unreachable or frozenset((donor, witness)) in disputes:
            continue
        verdict = agrees(got, witness, header, download, tolerance)
        if verdict is None:
            unreachable.add(witness)
            continue
        if verdict:
            logger.info("state of %s (round %d) confirmed by %s", donor[-8:], got.round, witness[-8:])
            return None
        disputes.add(frozenset((donor, witness)))
        reason = f"donor {donor[-8:]}: its round-{got.round} state disagrees with {witness[-8:]}'s"
        logger.warning("state download: %s; trying the next donor", reason)
        return reason
    if disputed:
        reason = f"donor {donor[-8:]}: disputed by another donor, and no third donor could decide"
        logger.warning("state download: %s", reason)
        return reason
    logger.warning(
        "state of %s (round %d) not confirmed: no second donor was available; its outer momentum"
        " is not taken (this peer starts with none)",
        donor[-8:],
        got.round,
    )
    got.momentum = [torch.zeros_like(m) for m in got.momentum]
    return None
