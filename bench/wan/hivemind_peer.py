"""The baseline users have today: our model and data, trained with `hivemind.Optimizer`.

    python -m bench.wan.hivemind_peer --config run.toml --initial-peers MADDR --host IP \
        --run-dir D --data-key slot0 --peers 4 [--minutes 6] [--no-delay-state-averaging]

Configured as hivemind's Optimizer docstring recommends for this setting: local updates
(`use_local_updates=True`: each peer's AdamW steps on its own gradients, parameters averaged
whenever the swarm has processed `target_batch_size = peers * H * batch_size` samples, i.e. about
every H local steps), averaging in the background (`delay_state_averaging=True`, hivemind's
default; `--no-delay-state-averaging` blocks in `step` instead: the bench tries both on its
tuning seeds), float16 on the wire for averaging and state downloads (`Float16Compression`, as
our arms' `wire_dtype = "float16"`), chunk timeouts for a slow link. Same inner optimizer,
schedule, clipping, model, data stream and seed as `p2p-trainer join`.

The learning rate is set every local step on the torch optimizer hivemind steps (`opt.opt`;
`opt.param_groups` hands out copies) and read back: lr.jsonl records, per round, the rate set and
the rate the optimizer holds, so the bench can check that the schedule took effect. Writes the
records and snapshots `join` writes (a round every H local steps), so `python -m bench.wan`
treats it like any other arm. Bytes come from the interface counters.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import hivemind
import torch
from hivemind.compression import Float16Compression
from hivemind.utils import get_dht_time

from bench.wan.bare_peer import RoundLog, scheduled_lr
from p2p_trainer.config import load_config
from p2p_trainer.round_log import ExchangeRecord
from p2p_trainer.train.data import TokenStream, load_corpus, validation_batches
from p2p_trainer.train.model import build_model

logger = logging.getLogger(__name__)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--initial-peers", action="append", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--data-key", required=True, help="Seeds the data stream (the bench: slot{k}).")
    p.add_argument("--peers", type=int, required=True, help="Expected swarm size (sets target_batch_size).")
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--no-delay-state-averaging", action="store_true", help="Average inside step (blocking).")
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
    stream = TokenStream(corpus.train, cfg.model.seq_len, cfg.data.batch_size, cfg.seed, args.data_key)
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
        delay_state_averaging=not args.no_delay_state_averaging,
        state_averaging_compression=Float16Compression(),
        load_state_compression=Float16Compression(),
        matchmaking_time=args.matchmaking_time_s,
        averaging_timeout=args.averaging_timeout_s,
        next_chunk_timeout=args.next_chunk_timeout_s,
        verbose=False,
    )
    try:
        wait_for_peers(dht, f"hm-{cfg.run_id()}", args.peers, stop)
        return train(args, cfg, model, opt, stream, val, stop, run_dir)
    finally:
        opt.shutdown()
        dht.shutdown()


def wait_for_peers(
    dht: hivemind.DHT, run_id: str, peers: int, stop: threading.Event, timeout_s: float = 60.0
) -> None:
    """Like `join --wait-for-peers`: a peer that starts alone would otherwise run epochs by itself
    and hand its state to the late ones, which is a different experiment. Each peer signs a DHT
    key (one subkey per peer) and waits until `peers` have; hivemind's progress tracker would
    only count peers once they step."""
    key, me = f"{run_id}_ready", str(dht.peer_id)
    dht.store(key, True, get_dht_time() + 3600, subkey=me)
    deadline, seen = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline and not stop.is_set():
        found = dht.get(key, latest=True)
        seen = len(found.value) if found is not None and isinstance(found.value, dict) else 0
        if seen >= peers:
            break
        time.sleep(0.5)
    logger.info("starting with %d of %d peers signed in", seen, peers)


def set_lr(opt: hivemind.Optimizer, lr: float) -> None:
    """Set the rate on the torch optimizer that hivemind steps."""
    for group in opt.opt.param_groups:
        group["lr"] = lr


def train(
    args: argparse.Namespace,
    cfg: Any,
    model: torch.nn.Module,
    opt: hivemind.Optimizer,
    stream: TokenStream,
    val: list[tuple[torch.Tensor, torch.Tensor]],
    stop: threading.Event,
    run_dir: Path,
) -> int:
    inner, h = cfg.inner, cfg.outer.num_inner_steps
    params = [p for p in model.parameters() if p.requires_grad]
    log = RoundLog(run_dir, args.data_key, "hivemind", params)
    lr_trace = open(run_dir / "lr.jsonl", "w")
    deadline = log.started + 60 * args.minutes if args.minutes else float("inf")
    step = tokens = 0
    epoch, exchanges = opt.local_epoch, []
    while step < cfg.total_inner_steps and not stop.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        wanted = scheduled_lr(cfg, step)
        set_lr(opt, wanted)
        x, y = stream.next_batch()
        loss = model(x, y)
        loss.backward()
        if inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, inner.grad_clip)
        held = float(opt.opt.param_groups[0]["lr"])  # what the step below uses
        t1 = time.monotonic()
        opt.step()  # local AdamW step; when the swarm reached target_batch_size, also averaging
        opt.zero_grad()
        t2 = time.monotonic()
        step, tokens = step + 1, tokens + x.numel()
        averaged = opt.local_epoch != epoch
        if averaged:  # group_size 0: hivemind does not say who took part (the analysis counts all)
            epoch = opt.local_epoch
            exchanges.append(ExchangeRecord("hivemind", True, 0, t2 - t1, t2 - t1, started_unix=time.time()))
        log.step_done(
            float(loss.detach()),
            x.numel(),
            (t1 - t0) + (0.0 if averaged else t2 - t1),
            t2 - t1 if averaged else 0.0,
        )
        if step % h == 0:
            # the rate the torch optimizer used for this step (load_state_from_peers may replace groups)
            lr_trace.write(json.dumps({"step": step - 1, "set": wanted, "held": held, "epoch": epoch}) + "\n")
            lr_trace.flush()
            log.end_round(step, tokens, tuple(exchanges))
            exchanges = []
    lr_trace.close()
    log.close(step, tokens, evaluate(model, val), stop.is_set())
    return 0


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    out = sum(float(model(x, y)) for x, y in val) / len(val)
    model.train()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
