"""The baseline users have today: our model and data, trained with `hivemind.Optimizer`.

    python -m bench.wan.hivemind_peer --config run.toml --initial-peers MADDR --host IP \
        --run-dir D --peers 4 [--minutes 4] [--snapshot-every 1]

Configured the way its users run it (HIVEMIND_NOTES.md): local updates (`use_local_updates=True`,
each peer's AdamW steps on its own gradients) and parameter averaging whenever the swarm has
processed `target_batch_size = peers * H * batch_size` samples, i.e. about every H local steps,
blocking (`delay_state_averaging=False`: of hivemind's two modes, the one that trains better on
the bench's links, so the baseline is compared at its best). Chunk timeouts are set for a slow
link, as the notes advise. Same inner optimizer, schedule, clipping, model, data and seed as
`p2p-trainer join`; writes the same metrics.jsonl records (one per averaging epoch) and snapshots,
so `python -m bench.wan` treats it like any other method. Bytes come from the interface counters.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import hivemind
import torch

from p2p_trainer.config import load_config
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, StartRecord
from p2p_trainer.train.data import TokenStream, load_corpus, validation_batches
from p2p_trainer.train.metrics import MetricsWriter
from p2p_trainer.train.model import build_model
from p2p_trainer.train.snapshots import save_snapshot
from p2p_trainer.train.trainer import lr_factor

logger = logging.getLogger(__name__)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--initial-peers", action="append", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--peers", type=int, required=True, help="Expected swarm size (sets target_batch_size).")
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--snapshot-every", type=int, default=0, help="Save params every this many epochs.")
    p.add_argument("--matchmaking-time-s", type=float, default=5.0)
    p.add_argument("--next-chunk-timeout-s", type=float, default=30.0)
    p.add_argument("--averaging-timeout-s", type=float, default=120.0)
    p.add_argument("--torch-threads", type=int, default=1)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hm-peer %(message)s")
    torch.set_num_threads(args.torch_threads)
    cfg = load_config(args.config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    model = build_model(cfg.model, cfg.seed)
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    val = validation_batches(corpus, cfg.model.seq_len, cfg.data.batch_size, cfg.data.val_batches)
    dht = hivemind.DHT(
        initial_peers=[a for arg in args.initial_peers for a in arg.split()],
        host_maddrs=[f"/ip4/{args.host}/tcp/0"],
        start=True,
    )
    peer_key = str(dht.peer_id)
    stream = TokenStream(corpus.train, cfg.model.seq_len, cfg.data.batch_size, cfg.seed, peer_key)
    inner, h = cfg.inner, cfg.outer.num_inner_steps
    opt = hivemind.Optimizer(
        dht=dht,
        run_id=f"hm-{cfg.run_id()}",
        target_batch_size=args.peers * h * cfg.data.batch_size,
        batch_size_per_step=cfg.data.batch_size,
        optimizer=lambda params: torch.optim.AdamW(
            params, lr=inner.lr, betas=inner.betas, weight_decay=inner.weight_decay
        ),
        params=model.parameters(),
        use_local_updates=True,
        delay_state_averaging=False,
        matchmaking_time=args.matchmaking_time_s,
        averaging_timeout=args.averaging_timeout_s,
        next_chunk_timeout=args.next_chunk_timeout_s,
        verbose=False,
    )
    try:
        wait_for_peers(opt, args.peers, stop)
        return train(args, cfg, model, opt, stream, val, stop, run_dir, peer_key)
    finally:
        opt.shutdown()
        dht.shutdown()


def wait_for_peers(
    opt: hivemind.Optimizer, peers: int, stop: threading.Event, timeout_s: float = 60.0
) -> None:
    """Like `join --wait-for-peers`: a peer that starts alone would otherwise run epochs by itself
    and hand its state to the late ones, which is a different experiment."""
    deadline = time.monotonic() + timeout_s
    while opt.tracker.global_progress.num_peers < peers and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.5)
    logger.info("starting with %d peers in the tracker", opt.tracker.global_progress.num_peers)


def train(
    args: argparse.Namespace,
    cfg: Any,
    model: torch.nn.Module,
    opt: hivemind.Optimizer,
    stream: TokenStream,
    val: list[tuple[torch.Tensor, torch.Tensor]],
    stop: threading.Event,
    run_dir: Path,
    peer_key: str,
) -> int:
    inner = cfg.inner
    total_steps = cfg.rounds * cfg.outer.num_inner_steps
    started = time.monotonic()
    deadline = started + 60 * args.minutes if args.minutes else float("inf")
    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    metrics.write(StartRecord(peer_key, time.time(), method="hivemind"))
    params = [p for p in model.parameters() if p.requires_grad]
    step = tokens = round_start_tokens = rounds = 0
    epoch = opt.local_epoch
    t_round, compute_s, blocked_s, losses = time.monotonic(), 0.0, 0.0, []
    while step < total_steps and not stop.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        for group in opt.param_groups:
            group["lr"] = inner.lr * lr_factor(step, inner.warmup_steps, total_steps, inner.min_lr_ratio)
        x, y = stream.next_batch()
        loss = model(x, y)
        loss.backward()
        if inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, inner.grad_clip)
        t1 = time.monotonic()
        opt.step()  # local AdamW step; when the swarm reached target_batch_size, also averaging
        opt.zero_grad()
        t2 = time.monotonic()
        step, tokens = step + 1, tokens + x.numel()
        losses.append(float(loss))
        averaged = opt.local_epoch != epoch
        compute_s += (t1 - t0) + (0.0 if averaged else t2 - t1)
        blocked_s += t2 - t1 if averaged else 0.0
        if averaged:
            epoch, rounds = opt.local_epoch, rounds + 1
            now = time.monotonic()
            # group_size 0: hivemind does not say who took part (the analysis counts all peers)
            exchange = ExchangeRecord("hivemind", True, 0, t2 - t1, t2 - t1)
            metrics.write(
                RoundRecord(
                    peer=peer_key, time_s=now - started, unix_time=time.time(), round=rounds - 1,
                    step=step, tokens=tokens, train_loss=sum(losses) / len(losses), val_loss=None,
                    compute_s=compute_s, blocked_s=blocked_s, wall_s=now - t_round,
                    round_tokens=tokens - round_start_tokens, exchanges=(exchange,),
                )
            )  # fmt: skip
            if args.snapshot_every and rounds % args.snapshot_every == 0:
                save_snapshot(run_dir / "snapshots", params, rounds, step, tokens, now - started)
            t_round, compute_s, blocked_s, losses, round_start_tokens = now, 0.0, 0.0, [], tokens
    save_snapshot(run_dir / "final", params, rounds, step, tokens, time.monotonic() - started)
    metrics.write(
        FinalRecord(
            peer=peer_key, round=rounds, tokens=tokens, val_loss=evaluate(model, val),
            time_s=time.monotonic() - started, stopped=stop.is_set(), step=step,
        )
    )  # fmt: skip
    metrics.close()
    return 0


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    out = sum(float(model(x, y)) for x, y in val) / len(val)
    model.train()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
