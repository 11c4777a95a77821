"""The GPU path, measured against bare torch in the same run (issue 15; `bench/gpu_check.sh`).

    python -m bench.gpu_check [--smoke] [--out DIR]

On one CUDA device, for a ~125M and a ~350M Llama-style model (`model.arch = "llama"`, bf16
autocast, fused AdamW, the same batch and sequence length):

- bare: the model in a plain torch loop (forward, backward, clip, AdamW step), no p2p-trainer
  around it: the reference;
- one peer: `p2p_trainer.train.trainer.Peer` with the in-process backend and method
  `independent`, the same steps: what the trainer itself costs;
- two peers exchanging: two `Peer`s on the same device in one process (threads), DiLoCo with
  H = 20 over the in-process backend (Δ averaged, Nesterov step): utilisation = their tokens/s
  together against bare's. Once with the outer state offloaded (`outer.offload = "auto"`: φ, m
  and θ's pinned staging copy on the host), once with it on the GPU (`"off"`), so the two lines
  show what offload saves in GPU memory and costs in host memory and tokens/s; then offloaded
  again at H = 100 (one timed round), where the host's outer step comes 5 × less often.

Each line gives tokens/s, MFU (6 · parameters · tokens/s over the device's peak bf16 rate,
`--peak-tflops`, 989 for an H200), the ratio to bare, the peak GPU memory, the peak host RSS
during the arm, and for the peer arms the bytes of outer state per peer and where they live; the
process's peak RSS is printed at the end. `--smoke` runs tiny models on the CPU in a few
seconds, to check the script itself where no GPU is lent (there both peer arms keep the state
on the host, the CPU's only memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.peak_rss import PeakRss
from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.model import build_model
from p2p_trainer.train.trainer import Peer

SIZES = {
    "125M": ModelConfig(
        arch="llama", vocab_size=32768, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, seq_len=1024
    ),
    "350M": ModelConfig(
        arch="llama", vocab_size=32768, d_model=1024, n_layers=24, n_heads=16, n_kv_heads=4, seq_len=1024
    ),
}
LONG_H = 100
"""Inner steps per round of the last arm (the others: 20)."""
SMOKE = {"smoke": ModelConfig(arch="llama", vocab_size=512, d_model=64, n_layers=2, n_heads=4, seq_len=64)}


def _tokens_file(directory: Path, vocab: int, n: int) -> Path:
    path = directory / "tokens.bin"
    np.random.default_rng(0).integers(0, vocab, n, dtype=np.uint16).tofile(path)
    return path


def _config(model: ModelConfig, corpus: Path, batch: int, device_bf16: bool, method: str) -> RunConfig:
    return RunConfig(
        seed=0,
        rounds=1_000_000,
        model=model,
        data=DataConfig(corpus=str(corpus), format="tokens", batch_size=batch, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=5, bf16=device_bf16),
        outer=OuterConfig.for_method(method, num_inner_steps=20),
    )


def bare(cfg: RunConfig, device: str, steps: int, warmup: int) -> float:
    """Tokens/s of a plain loop over the same model, batch and optimizer."""
    model = build_model(cfg.model, cfg.seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.inner.lr, fused=device.startswith("cuda"))
    b, t = cfg.data.batch_size, cfg.model.seq_len
    x = torch.randint(0, cfg.model.vocab_size, (b, t + 1), device=device)
    t0 = 0.0
    for s in range(warmup + steps):
        if s == warmup:
            _sync(device)
            t0 = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=cfg.inner.bf16):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.inner.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return steps * b * t / (time.perf_counter() - t0)


def peers(cfg: RunConfig, device: str, n: int, rounds: int) -> tuple[float, dict[str, Any]]:
    """Tokens/s of `n` trainer peers together on one device (the first round is warm-up), and
    one peer's outer state: its bytes and where it lives."""
    corpus = load_corpus(cfg.data, cfg.model.seq_len, cfg.model.vocab_size)
    swarm = InProcessSwarm(n, cfg.seed)
    ps = [Peer(cfg, swarm.exchange(i), corpus, f"peer{i}", device=device) for i in range(n)]
    marks: list[tuple[float, int]] = []
    barrier = threading.Barrier(n)

    def work(i: int) -> None:
        for r in range(rounds + 1):
            ps[i].run_round()
            if r == 0:
                barrier.wait()
                if i == 0:
                    _sync(device)
                    marks.append((time.perf_counter(), sum(p.tokens for p in ps)))
        barrier.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    _sync(device)
    (t0, tok0) = marks[0]
    tps = (sum(p.tokens for p in ps) - tok0) / (time.perf_counter() - t0)
    memory = ps[0].outer_memory()
    return tps, {"outer_state_bytes": memory.total, "outer_state_on": memory.where}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_gpu_gib(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return round(peak, 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2, help="Timed rounds (20 steps) of the peer arms.")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible: run with --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    sizes = SMOKE if args.smoke else SIZES
    batch, steps = (4, 5) if args.smoke else (args.batch, args.steps)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in sizes.items():
            corpus = _tokens_file(Path(tmp), model.vocab_size, 4_000_000 if not args.smoke else 200_000)
            params = build_model(model, 0).num_params()
            base = _config(model, corpus, batch, device == "cuda", "independent")
            diloco = OuterConfig.for_method("diloco", num_inner_steps=20)
            offloaded = dataclasses.replace(base, outer=diloco)
            on_gpu = dataclasses.replace(base, outer=dataclasses.replace(diloco, offload="off"))
            # DiLoCo's reference H is in the hundreds: at H = 100 the host's outer step is 5 × rarer
            long_rounds = dataclasses.replace(
                base, outer=OuterConfig.for_method("diloco", num_inner_steps=LONG_H)
            )
            arms = [  # (arm, config, peers (0: the bare loop), timed rounds)
                ("bare", base, 0, 0),
                ("one peer", base, 1, args.rounds),
                ("two peers, diloco", offloaded, 2, args.rounds),
                ("two peers, diloco, state on GPU", on_gpu, 2, args.rounds),
                (f"two peers, diloco, H = {LONG_H}", long_rounds, 2, 1),
            ]
            results: dict[str, float] = {}
            for arm, cfg, n, rounds in arms:
                extra: dict[str, Any] = {}
                with PeakRss() as rss:
                    if n == 0:
                        tps = bare(cfg, device, steps, warmup=3)
                    else:
                        tps, extra = peers(cfg, device, n, rounds)
                results[arm] = tps
                row = {
                    "model": name,
                    "params_M": round(params / 1e6, 1),
                    "arm": arm,
                    "tokens_per_s": round(tps),
                    "mfu": round(6 * params * tps / (args.peak_tflops * 1e12), 4),
                    "ratio_to_bare": round(tps / results["bare"], 3),
                    "peak_gpu_gib": _peak_gpu_gib(device),
                    "peak_host_rss_gib": rss.peak_gib,
                    **extra,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    host_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"peak_host_rss_gib": round(host_gib, 2)}), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(
            json.dumps({"rows": rows, "peak_host_rss_gib": host_gib}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
