"""Run N peers of one method in one process (threads) over the in-process backend.

The reference for the networked swarm and the harness of the convergence check.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from p2p_trainer.algo.outer import consensus_distance
from p2p_trainer.config import RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import check_corpus
from p2p_trainer.train.trainer import Peer, RoundMetrics


@dataclass
class InProcessResult:
    val_loss: list[float]
    """Final validation loss of each peer's anchor (nats/byte)."""
    mean_model_val_loss: float
    """Validation loss of the peers' averaged model."""
    consensus_distance: float
    tokens: int
    """Total tokens processed by all peers."""
    history: list[list[RoundMetrics]]
    failed_exchanges: int
    anchors: list[list[torch.Tensor]]
    """Each peer's final φ."""


def run_inprocess(
    cfg: RunConfig,
    num_peers: int,
    torch_threads: int = 1,
    stop: threading.Event | None = None,
    data_key: str = "peer",
) -> InProcessResult:
    """Train every peer for `cfg.rounds` rounds, or until `stop` is set (checked between inner steps);
    peer i reads the data stream `{data_key}{i}`."""
    stop = stop or threading.Event()
    corpus = check_corpus(cfg)
    swarm = InProcessSwarm(num_peers, cfg.seed)
    peers = [Peer(cfg, swarm.exchange(i), corpus, peer_key=f"{data_key}{i}") for i in range(num_peers)]
    history: list[list[RoundMetrics]] = [[] for _ in peers]
    errors: list[BaseException] = []
    torch.set_num_threads(torch_threads)

    def work(i: int) -> None:
        try:
            for _ in range(cfg.rounds):
                m = peers[i].run_round_until(stop.is_set)
                if m is None:
                    break
                history[i].append(m)
        except BaseException as exc:  # surfaced to the caller below, not swallowed
            errors.append(exc)
        finally:
            # a peer that stops early must not keep the others waiting in a blocking exchange
            if errors or stop.is_set():
                swarm.leave(i)

    threads = [threading.Thread(target=work, args=(i,), name=f"peer{i}") for i in range(num_peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    anchors = [p.state.anchor for p in peers]
    mean = [torch.stack(ts).mean(0) for ts in zip(*anchors, strict=True)]
    return InProcessResult(
        val_loss=[p.evaluate(p.state.anchor) for p in peers],
        mean_model_val_loss=peers[0].evaluate(mean),
        consensus_distance=consensus_distance(anchors),
        tokens=sum(p.tokens for p in peers),
        history=history,
        failed_exchanges=sum(1 for h in history for m in h for e in m.report.exchanges if not e.ok),
        anchors=anchors,
    )
