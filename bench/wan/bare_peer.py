"""The bare torch loop: our model, data and AdamW schedule, and nothing else (no node, no exchange).

    python -m bench.wan.bare_peer --config run.toml --run-dir D --data-key slot0 [--minutes 6]

What one peer's CPU cap can do when no p2p code runs beside it: the denominator of every arm's
throughput in `python -m bench.wan`. It runs with the settings a peer's inner steps run with
(`train/trainer.py: inner_step_settings`). It writes the records and snapshots a `join` peer
writes (a round every H steps), so the bench analyses it like any other arm. `RoundLog` is shared with
the hivemind baseline.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from p2p_trainer.config import RunConfig, load_config
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, StartRecord
from p2p_trainer.train.data import TokenStream, load_corpus
from p2p_trainer.train.metrics import MetricsWriter
from p2p_trainer.train.model import build_model
from p2p_trainer.train.snapshots import save_snapshot
from p2p_trainer.train.trainer import inner_step_settings, lr_factor

logger = logging.getLogger(__name__)


def scheduled_lr(cfg: RunConfig, step: int) -> float:
    """The learning rate of inner step `step`: `join`'s schedule (warm-up, then cosine or constant)."""
    inner = cfg.inner
    return inner.lr * lr_factor(step, inner.warmup_steps, cfg.total_inner_steps, inner.min_lr_ratio)


class RoundLog:
    """A round record and a snapshot of the parameters every H steps, on the peer's own clock."""

    def __init__(self, run_dir: Path, peer: str, method: str, params: Sequence[torch.Tensor]) -> None:
        self.run_dir, self.peer, self.params = run_dir, peer, params
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self.started = time.monotonic()
        self.metrics.write(StartRecord(peer, time.time(), method=method))
        self.t_round, self.compute_s, self.blocked_s, self.round_tokens = self.started, 0.0, 0.0, 0
        self.losses: list[float] = []
        self.rounds = 0

    def step_done(self, loss: float, tokens: int, compute_s: float, blocked_s: float = 0.0) -> None:
        self.losses.append(loss)
        self.round_tokens += tokens
        self.compute_s += compute_s
        self.blocked_s += blocked_s

    def end_round(self, step: int, tokens: int, exchanges: tuple[ExchangeRecord, ...] = ()) -> None:
        now = time.monotonic()
        self.metrics.write(
            RoundRecord(
                peer=self.peer, time_s=now - self.started, unix_time=time.time(), round=self.rounds,
                step=step, tokens=tokens, train_loss=sum(self.losses) / max(1, len(self.losses)),
                val_loss=None, compute_s=self.compute_s, blocked_s=self.blocked_s, wall_s=now - self.t_round,
                round_tokens=self.round_tokens, exchanges=exchanges,
            )
        )  # fmt: skip
        self.rounds += 1
        save_snapshot(self.run_dir / "snapshots", self.params, self.rounds, step, tokens, now - self.started)
        self.t_round, self.compute_s, self.blocked_s, self.round_tokens, self.losses = now, 0.0, 0.0, 0, []

    def close(self, step: int, tokens: int, val_loss: float | None, stopped: bool) -> None:
        elapsed = time.monotonic() - self.started
        self.metrics.write(
            FinalRecord(
                peer=self.peer, round=self.rounds, tokens=tokens, val_loss=val_loss, time_s=elapsed,
                stopped=stopped, step=step,
            )
        )  # fmt: skip
        self.metrics.close()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--data-key", required=True, help="Seeds the data stream (the bench: slot{k}).")
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--torch-threads", type=int, default=1)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s bare-peer %(message)s")
    torch.set_num_threads(args.torch_threads)
    cfg = load_config(args.config)
    # the settings a peer's inner steps run with (not the node): ÷ bare loop measures the node
    inner_step_settings(cfg, torch.device("cpu"))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(cfg.model, cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    inner, h = cfg.inner, cfg.outer.num_inner_steps
    opt = torch.optim.AdamW(params, lr=inner.lr, betas=inner.betas, weight_decay=inner.weight_decay)
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    stream = TokenStream(corpus.train, cfg.model.seq_len, cfg.data.batch_size, cfg.seed, args.data_key)
    log = RoundLog(run_dir, args.data_key, "bare", params)
    deadline = log.started + 60 * args.minutes if args.minutes else float("inf")
    step = tokens = 0
    while step < cfg.total_inner_steps and not stop.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        for group in opt.param_groups:
            group["lr"] = scheduled_lr(cfg, step)
        x, y = stream.next_batch()
        loss = model(x, y)
        loss.backward()
        if inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, inner.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step, tokens = step + 1, tokens + x.numel()
        log.step_done(float(loss.detach()), x.numel(), time.monotonic() - t0)
        if step % h == 0:
            log.end_round(step, tokens)
    log.close(step, tokens, None, stop.is_set())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
