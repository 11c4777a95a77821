"""Inner-loop overhead: p2p-trainer's `Peer.inner_step` vs a bare torch loop, same model and batch.

Both loops run AdamW with the same clipping on the same micro-batches; trials alternate so drift
of a shared machine cancels, and the median of the per-trial ratios is reported.

    .venv/bin/python -m bench.overhead [--steps 30] [--trials 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from p2p_trainer.algo.methods import RoundReport
from p2p_trainer.config import InnerConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.model import build_model
from p2p_trainer.train.trainer import Peer


def bare_loop(cfg: RunConfig, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model = build_model(cfg.model, cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.inner.lr, betas=cfg.inner.betas)
    t0 = time.perf_counter()
    for x, y in batches:
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.inner.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return len(batches) / (time.perf_counter() - t0)


def our_loop(cfg: RunConfig, steps: int) -> float:
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "peer0")
    report = RoundReport(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        peer.inner_step(report)
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = RunConfig(rounds=1, inner=InnerConfig(warmup_steps=0), outer=OuterConfig.for_method("independent"))
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    # the bare loop gets the very batches our stream produces (its first `steps`, as our_loop's fresh
    # peer takes them), precomputed (no data cost at all)
    peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "peer0")
    batches = [peer.stream.next_batch() for _ in range(args.steps)]
    our_loop(cfg, 3)  # warm-up
    ratios = []
    for trial in range(args.trials):
        if trial % 2 == 0:  # alternate the order so drift of the machine cancels
            bare = bare_loop(cfg, batches)
            ours = our_loop(cfg, args.steps)
        else:
            ours = our_loop(cfg, args.steps)
            bare = bare_loop(cfg, batches)
        ratios.append(ours / bare)
        print(
            f"trial {trial}: ours {ours:.2f} steps/s, bare torch {bare:.2f} steps/s, ratio {ours / bare:.3f}"
        )
    print(
        f"median throughput ratio (ours / bare torch): {statistics.median(ratios):.3f} "
        f"(model {build_model(cfg.model, 0).num_params():,} params, batch {cfg.data.batch_size}x{cfg.model.seq_len})"
    )


if __name__ == "__main__":
    main()
