"""The end of a run: one last all-peer average of the anchors, so every peer holds the consensus.

During training the peers' anchors φ only approach each other (groups mix a few peers at a time,
background exchanges land a round late), so without this step a user would have N slightly
different models and no single one that is the swarm's. A peer whose run ends normally (its
rounds are done or its time bound passed) therefore takes part in one blocking exchange of φ with
every live peer (group `ALL`, full quorum), then saves and evaluates the result. The weights are
equal, except that a peer that stopped while others train on counts little (`final_weight`).

Meeting: the exchange's key is the tag "final" and the run's configured round count, not the
round a peer stopped at, so peers stopped by a time bound after different numbers of rounds
still meet. A peer that finishes first waits at most `exchange.final_wait_s` for the others;
the wait covers the skew between the peers' ends. A peer that is gone is not waited for past its
failed sends or its heartbeat (`allreduce.py`), so a dead peer cannot hang the end of a run.

Meeting again: a member that dies during the exchange, or whose view of the swarm differed from
the others' when it arrived (peers with different member lists exchange under different keys),
leaves the survivors with an incomplete result: parts kept as their owners' own values, which is
not the consensus. A peer whose result is incomplete and ended before the wait ran out (so not
because nobody came) meets the others again with a fresh view, under the next attempt's key, at
most `FINAL_ATTEMPTS` times in all; the survivors saw the same death and do the same. A later result
replaces the kept one only if it is a whole merge with others (a peer left alone because the
others finished keeps its partial merge), or the kept one was a failure.

Failure keeps work: the checkpoint is written before the exchange, a `Failed` result (or a stop
signal during the wait) keeps the peer's own φ and says why in the log and the final record. An
`Ok` result is adopted as the exchanges in training are: each part is the mean of the members its
owner heard from, and `group_size`/`own_parts` in the record say how complete it was.

A worse average is not kept (`keep_the_better`): models that drifted apart (a swarm split for
many rounds, exchanges that kept failing) can average to a model worse than any of them, and a
user's run must not end there. Each peer evaluates both on the validation batches every peer
shares and goes back to its own where the average is more than
`exchange.final_max_loss_increase` worse, with a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch

from p2p_trainer.algo.methods import RoundReport, merged_fully
from p2p_trainer.config import RunConfig
from p2p_trainer.exchange.interface import ALL, ExchangeRequest, ExchangeResult, Failed, Ok
from p2p_trainer.net.entry import has_left
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.round_log import ExchangeRecord
from p2p_trainer.train.trainer import Peer
from p2p_trainer.train.workload import seed_weights

logger = logging.getLogger(__name__)

FINAL_TAG = "final"
BEFORE_FINAL_DIR = "before_final"
"""Under a peer's run directory: its own φ before an agreement that changed it (a snapshot file),
which `local`'s summary compares with the consensus."""
POLL_S = 0.2
"""How often the wait checks for a stop signal."""
FINAL_ATTEMPTS = 3
"""Most meetings of one final agreement (the first and the retries after an incomplete one)."""
EARLY_WEIGHT = 0.01
"""The final weight of a peer that stopped while others train on (`final_weight`), against 1 for
the others: its model is older than theirs, and everything it learnt is in theirs already."""
STALE_PERIODS = 4.0
"""Heartbeat periods the others must train on after a peer stopped for its model to count as
older in the final mean (`final_weight`): well past a view's lag of a period or two."""


def wants_final_agreement(cfg: RunConfig) -> bool:
    """On for the communicating methods unless the config turns it off; never for independent."""
    return cfg.exchange.final_agreement and cfg.outer.method != "independent"


def seed_reference(cfg: RunConfig) -> tuple[torch.Tensor, ...]:
    """The final exchange's reference (§10): the seed's model, the same on every peer.

    Each peer's update is then its whole run's progress. Honest peers' progress is alike in size
    and direction (the same data, mixed all run), even where they stopped rounds apart; a model
    scaled, reversed or replaced is far outside it. The round-before anchor would bound tighter,
    but gossip peers' anchors stand further apart than one round's update, and the final merge
    would refuse honest peers."""
    return seed_weights(cfg)


def training_on(beats: list[Heartbeat], self_id: str, last_round: int) -> list[str]:
    """The other live peers still training: not in or past their last round, whether one named
    by a time bound (`has_left`, net/entry.py) or the run's last."""
    return [
        b.peer_id
        for b in beats
        if b.peer_id != self_id and not has_left(b, b.round) and b.round + 1 < last_round
    ]


def wait_for_the_others(
    beats: Callable[[], list[Heartbeat]],
    self_id: str,
    last_round: int,
    limit_s: float,
    stopped: Callable[[], bool],
) -> float:
    """Block until no other live peer trains on (`training_on`), `limit_s` passes or `stopped`;
    the seconds waited."""
    t0 = time.monotonic()
    while training_on(beats(), self_id, last_round) and time.monotonic() - t0 < limit_s and not stopped():
        time.sleep(POLL_S)
    return time.monotonic() - t0


def final_weight(waited_s: float, stale_s: float) -> float:
    """This peer's weight in the final mean: `EARLY_WEIGHT` where the others trained on for
    `stale_s` or longer after it stopped (`wait_for_the_others`), else 1.

    With equal weights, an early stopper's older model pulled the others' back, by more than
    `final_max_loss_increase`: they then kept their own, and the swarm ended on no one model. Its
    own learning is in their models already (they merged with it until it left). Each peer lowers
    only its own weight, which a receiver's bound (at most `weight_ratio_max` × 1, §10) accepts.
    Peers that stop within `stale_s` of each other keep equal weights, so that the final mean of
    gossip methods still averages their different models."""
    return EARLY_WEIGHT if waited_s >= stale_s else 1.0


def others_wait_s(cfg: RunConfig) -> float:
    """The longest `wait_for_the_others` before the final exchange: half of `final_wait_s`, so
    that the exchange, which loses what was waited (`final_request`), keeps at least the rest."""
    return cfg.exchange.final_wait_s / 2


def stopped_early_weight(
    cfg: RunConfig,
    own_round: int,
    beats: Callable[[], list[Heartbeat]],
    self_id: str,
    stopped: Callable[[], bool],
) -> tuple[float, float]:
    """A peer's weight in the final mean and the seconds it waited for the others first: a peer
    stopped by its time bound (short of the run's rounds) waits for the others to stop
    (`wait_for_the_others`), and counts `EARLY_WEIGHT` if they trained on long enough
    (`final_weight`); one whose rounds are done counts 1 at once."""
    if own_round >= cfg.rounds:
        return 1.0, 0.0
    waited_s = wait_for_the_others(beats, self_id, cfg.rounds, others_wait_s(cfg), stopped)
    weight = final_weight(waited_s, STALE_PERIODS * cfg.network.view_period_s)
    if weight < 1.0:
        logger.info(
            "the others trained on for %.1f s after this peer stopped: its older model counts "
            "%.2f in the final mean, theirs 1 each",
            waited_s,
            weight,
        )
    return weight, waited_s


def final_request(
    cfg: RunConfig,
    reference: tuple[torch.Tensor, ...] | None = None,
    weight: float = 1.0,
    waited_s: float = 0.0,
) -> ExchangeRequest:
    """The final exchange: all live peers, weighted by `weight` (`final_weight`; all 1: the plain
    mean), everyone awaited for at most `final_wait_s` less the `waited_s` spent waiting for the
    others before it (`others_wait_s` at most), then at most `exchange.timeout_s` (one exchange's
    bound) for the transfer.

    Always float32 on the wire: the result is the model the user keeps. Contributions and results
    are bounded (§10) against `reference`, the weights every peer started from: by default the
    seed's model (`seed_reference`); a workload of one's own gives its initial weights.
    """
    wait_s = cfg.exchange.final_wait_s - min(waited_s, others_wait_s(cfg))
    return ExchangeRequest(
        FINAL_TAG,
        cfg.rounds,
        ALL,
        weight=weight,
        weight_floor=1.0,  # a weight over 1 is a lie (§10)
        timeout_s=wait_s + cfg.exchange.timeout_s,
        quorum_fraction=1.0,
        quorum_wait_s=wait_s,
        grace_s=0.0,
        result_wait_s=wait_s,
        reference=seed_reference(cfg) if reference is None else reference,
        in_round=False,  # peers stopped by time at different rounds meet here
    )


def _wait(peer: Peer, request: ExchangeRequest, stopped: Callable[[], bool]) -> ExchangeResult:
    t0 = time.monotonic()
    pending = peer.exchange.start(peer.state.anchor, request)
    limit = t0 + request.timeout_s + 1.0
    while not pending.done() and time.monotonic() < limit:
        if stopped():
            return Failed("a stop signal came before the others", time.monotonic() - t0)
        time.sleep(POLL_S)
    return pending.result(max(0.0, limit - time.monotonic()))


def adopt_anchor(peer: Peer, anchor: list[torch.Tensor]) -> None:
    """φ ← `anchor`, and θ moves by the same amount: a peer stopped mid-round keeps the steps it
    took since its last round (θ − φ is unchanged), so a resumed run carries on from there."""
    with torch.no_grad():
        for p, old, new in zip(peer.params, peer.state.anchor, anchor, strict=True):
            if torch.equal(p.detach().float().cpu(), old.cpu()):  # at a round's end: θ = φ exactly
                p.copy_(new)
            else:
                p.add_((new - old).to(p.device, p.dtype))
    peer.state.anchor = [a.detach().float().clone() for a in anchor]


def keep_the_better(
    peer: Peer, own: list[torch.Tensor], max_increase: float
) -> tuple[float | None, float | None, bool]:
    """After an agreement that changed φ to the average: (the own model's validation loss, the
    average's, whether the peer went back to its own). No validation batches: the average stays."""
    if not peer.val:
        return None, None, False
    own_loss, mean_loss = peer.evaluate(own), peer.evaluate(peer.state.anchor)
    if mean_loss <= own_loss + max_increase * abs(own_loss):
        return own_loss, mean_loss, False
    logger.warning(
        "final agreement: the swarm's average has validation loss %.4f, this peer's own model %.4f"
        " (more than exchange.final_max_loss_increase=%g worse): the models had drifted apart;"
        " this peer keeps its own",
        mean_loss,
        own_loss,
        max_increase,
    )
    adopt_anchor(peer, own)
    return own_loss, mean_loss, True


def _better(again: ExchangeResult, kept: ExchangeResult) -> bool:
    """Whether a later meeting's result replaces the one kept: a whole merge with others always
    does, any merge replaces a failure. A result of this peer alone (the others finished and left)
    never replaces a merge, nor does another partial one."""
    if not isinstance(again, Ok):
        return False
    return (merged_fully(again) and again.group_size >= 2) or not isinstance(kept, Ok)


def _meet_again(latest: ExchangeResult, took_s: float, request: ExchangeRequest) -> bool:
    """The latest meeting was incomplete and ended before the wait for the others ran out (taken
    as this peer measured it): a view mismatch or a member that died mid-exchange, which a meeting
    with fresh views repairs."""
    return not merged_fully(latest) and took_s < request.quorum_wait_s


def agree(
    peer: Peer, request: ExchangeRequest, stopped: Callable[[], bool], retry_pause_s: float = 0.0
) -> ExchangeRecord:
    """Average φ with every live peer and adopt the result; on failure keep φ. Returns the record.

    `retry_pause_s`: how long to wait before meeting again (a view period: the views refresh)."""
    t0 = time.monotonic()
    res = latest = _wait(peer, request, stopped)
    took, attempt = time.monotonic() - t0, 1
    while attempt < FINAL_ATTEMPTS and _meet_again(latest, took, request) and not stopped():
        logger.info(
            "final agreement: attempt %d incomplete (%s); meeting the others again",
            attempt,
            f"{latest.group_size} peer(s), left out {list(latest.left_out)}"
            if isinstance(latest, Ok)
            else latest.reason,
        )
        time.sleep(retry_pause_s)
        began = time.monotonic()
        latest = _wait(peer, dataclasses.replace(request, gossip_step=attempt), stopped)
        took, attempt = time.monotonic() - began, attempt + 1
        if _better(latest, res):
            res = latest
    report = RoundReport(peer.state.round)
    report.add(FINAL_TAG, res, time.monotonic() - t0)  # logs a failure and why
    if isinstance(res, Ok):
        adopt_anchor(peer, res.tensors)
        logger.info(
            "final agreement: averaged with %d peer(s) in %.1f s%s%s",
            res.group_size,
            res.elapsed_s,
            f", {res.own_parts} part(s) kept as own values" if res.own_parts else "",
            f" (attempt {attempt})" if attempt > 1 else "",
        )
    else:
        logger.warning("final agreement failed (%s); this peer keeps its own model", res.reason)
    return report.exchanges[-1]
