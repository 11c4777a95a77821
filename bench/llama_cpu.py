"""A ≥ 20M-parameter Llama with a trained BPE: a 2-peer local swarm against bare torch, on the CPU.

    python -m bench.llama_cpu --out DIR [--seconds 600] [--tiny]

1. `p2p-trainer tokenizer train` makes a byte-level BPE of 8192 tokens from the bundled
   Shakespeare, offline.
2. The model: Llama (`model.arch = "llama"`), d_model 512, 6 layers, 8 heads, SwiGLU 1408, tied
   embedding, the tokenizer's vocabulary, 256-token context: about 23.5M parameters (the count is
   checked to be ≥ 20M before anything runs).
3. bare: two plain torch loops (forward, backward, clipping, fused AdamW step, as the peer's),
   the same model from the same seed, on the batches of the swarm peers' own data streams (`TokenStream` keys peer0 and
   peer1 over the same tokenized corpus), side by side for `--seconds` / 2 before the swarm and
   again after it; their rate is the mean of the two halves, which cancels a steady drift of the
   machine's speed (it changes by tens of percent over minutes on a shared host).
4. swarm: `p2p-trainer local --peers 2` with the same config (the shipped default's method,
   codecs and quorum, at H = 10 inner steps per round) for the same `--seconds` (its `--minutes`).

Fair comparison on a small machine: `local` gives each peer cpu_count // peers torch threads (one
each on 2 cores), so the bare side is two processes with as many torch threads each, running at
the same time. Both sides then hold the same cores with the same per-process thread count, and
each side's throughput is the sum of its two workers. One bare loop with all the cores would measure
intra-op scaling instead, which the peers are not given. What the swarm's processes spend besides
training (each peer's DHT process and p2pd, the exchanges' serialisation) competes for the same
cores, and that is part of what is measured.

First, one process alternates the peer's own inner step (`Peer.inner_step`, no node, no exchange)
with the bare step, `--steps` times each after a warm-up: the training code's cost by itself.

Reported (printed and in DIR/llama_cpu.json): the paired steps' ratio, inner-step tokens/s (tokens of the inner steps over
their time, `RoundRecord.compute_s`, the first round left out as warm-up) and overall tokens/s
(tokens over wall time from the end of the first round to the end of the last, exchanges and outer
steps included) of the swarm, the bare loops' tokens/s, the ratios, the model's parameter bytes
and the bytes the outer state adds (φ and m; θ's staging copy where offloaded: never on the CPU),
and the peak RSS of each bare and each peer process for context.

The full run takes about 2 × `--seconds` plus 3–4 minutes (tokenizer, paired steps, start-up,
final agreement): about 24 minutes with the default 600 s. `--tiny` shrinks everything to check the script in
about a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.peak_rss import PeakRss
from p2p_trainer import processes
from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, RunConfig, load_config
from p2p_trainer.config.toml_io import to_toml
from p2p_trainer.round_log import RoundRecord, read_log
from p2p_trainer.run.launcher import thread_env
from p2p_trainer.train.data import Corpus
from p2p_trainer.train.model import build_model

FULL = ModelConfig(arch="llama", vocab_size=8192, d_model=512, n_layers=6, n_heads=8, seq_len=256)
TINY = ModelConfig(arch="llama", vocab_size=512, d_model=64, n_layers=2, n_heads=4, seq_len=64)
MIN_PARAMS = 20_000_000
PEERS = 2
WARMUP_STEPS = 2
"""Bare loops' first steps left out of the timing (allocator and kernel warm-up)."""


def run_config(model: ModelConfig, tokenizer: Path, tiny: bool) -> RunConfig:
    shipped = load_config(None)
    return RunConfig(
        seed=0,
        rounds=1_000_000,  # the time bound ends the run
        model=model,
        data=DataConfig(tokenizer=str(tokenizer), batch_size=2 if tiny else 4, val_batches=2),
        inner=InnerConfig(lr=6e-4, warmup_steps=10, eval_every=0),
        # the shipped default's method, codecs and quorum (what `p2p-trainer local` runs), at H = 10
        outer=dataclasses.replace(shipped.outer, num_inner_steps=3 if tiny else 10),
        exchange=shipped.exchange,
    )


def train_tokenizer(out: Path, vocab: int) -> int:
    """The BPE, by the project's own command; returns its vocabulary size."""
    path = out / "tokenizer.json"
    cmd = [sys.executable, "-m", "p2p_trainer", "tokenizer", "train", "--corpus", "shakespeare"]
    subprocess.run([*cmd, "--vocab-size", str(vocab), "--out", str(path)], check=True)
    from p2p_trainer.train.tokenizer import load_tokenizer

    return load_tokenizer(DataConfig(tokenizer=str(path))).vocab_size


def threads_per_worker() -> int:
    """What `p2p-trainer local` gives each of its peers."""
    return max(1, (os.cpu_count() or 1) // PEERS)


class BareLoop:
    """The plain torch loop both comparisons run: the config's model from its seed, the peer's
    optimizer (fused AdamW, as `Peer` builds it on the CPU) and stream `key` of the corpus."""

    def __init__(self, cfg: RunConfig, corpus: Corpus, key: str) -> None:
        from p2p_trainer.train.data import TokenStream

        self.stream = TokenStream(corpus.train, cfg.model.seq_len, cfg.data.batch_size, cfg.seed, key)
        self.model = build_model(cfg.model, cfg.seed)
        inner = cfg.inner
        self.grad_clip = inner.grad_clip
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=inner.lr,
            betas=inner.betas,
            weight_decay=inner.weight_decay,
            fused=True,
        )

    def step(self) -> torch.Tensor:
        x, y = self.stream.next_batch()
        loss: torch.Tensor = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


def bare_worker(config: Path, key: str, seconds: float, result: Path) -> None:
    """One bare loop in this process, for `seconds`, with a peer's torch threads; writes its timing."""
    from p2p_trainer.train.data import check_corpus

    torch.set_num_threads(threads_per_worker())
    cfg = load_config(str(config))
    torch.set_flush_denormal(cfg.inner.flush_denormal)  # as the peer's training thread
    bare = BareLoop(cfg, check_corpus(cfg), key)
    steps, t0, end, loss = 0, 0.0, time.monotonic() + seconds, torch.zeros(())
    while time.monotonic() < end or steps <= WARMUP_STEPS:
        if steps == WARMUP_STEPS:
            t0 = time.monotonic()
        loss = bare.step()
        steps += 1
    timed = steps - WARMUP_STEPS
    tokens = timed * cfg.data.batch_size * cfg.model.seq_len
    out = {"steps": timed, "tokens": tokens, "seconds": time.monotonic() - t0, "loss": float(loss.detach())}
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result.write_text(json.dumps(out))


def paired_worker(config: Path, steps: int, result: Path) -> None:
    """The peer's own inner step (`Peer.inner_step`, no node, no exchange) against the bare step,
    alternating in one process on the same model shape and stream: what the training code costs
    by itself, apart from the node processes and exchanges a swarm adds."""
    from p2p_trainer.exchange.inprocess import InProcessSwarm
    from p2p_trainer.train.data import check_corpus
    from p2p_trainer.train.trainer import Peer, RoundReport

    torch.set_num_threads(threads_per_worker())
    cfg = load_config(str(config))
    corpus = check_corpus(cfg)
    peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "peer0")
    bare = BareLoop(cfg, corpus, "peer0")
    report = RoundReport(0)
    times = {"bare": 0.0, "peer": 0.0}
    for i in range(WARMUP_STEPS + steps):
        for name, step in (("bare", bare.step), ("peer", lambda: peer.inner_step(report))):
            t0 = time.monotonic()
            step()
            if i >= WARMUP_STEPS:
                times[name] += time.monotonic() - t0
    out = {"steps": steps, "bare_s_per_step": times["bare"] / steps, "peer_s_per_step": times["peer"] / steps}
    result.write_text(json.dumps(out))


def run_paired(config: Path, out: Path, steps: int) -> dict[str, Any]:
    path = out / "paired.json"
    argv = [sys.executable, "-m", "bench.llama_cpu", "--paired-worker", "--config", str(config)]
    argv += ["--steps", str(steps), "--out", str(path)]
    subprocess.run(argv, env={**os.environ, **thread_env(threads_per_worker())}, check=True)
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def run_bare(config: Path, out: Path, seconds: float, label: str) -> list[dict[str, Any]]:
    """The two bare loops side by side, each in its own process."""
    me = [sys.executable, "-m", "bench.llama_cpu", "--bare-worker", "--config", str(config)]
    files = [out / f"bare-{label}{i}.json" for i in range(PEERS)]
    env = {**os.environ, **thread_env(threads_per_worker())}  # as `local` starts its peers
    procs = [
        subprocess.Popen([*me, "--key", f"peer{i}", "--seconds", str(seconds), "--out", str(f)], env=env)
        for i, f in enumerate(files)
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a bare loop failed (its output is above)")
    return [json.loads(f.read_text()) for f in files]


def run_swarm(config: Path, out: Path, seconds: float) -> tuple[list[list[RoundRecord]], list[int]]:
    """`p2p-trainer local --peers 2` for `seconds`; each peer's rounds and its peak RSS."""
    run_dir = out / "swarm"
    cmd = [sys.executable, "-m", "p2p_trainer", "local", "--config", str(config), "--peers", str(PEERS)]
    cmd += ["--minutes", f"{seconds / 60:.4f}", "--no-live", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd)

    def peers() -> list[int]:  # the training processes (their DHT processes are forks with their argv)
        return [p for p in processes.child_pids(proc.pid) if " join " in " ".join(processes.cmdline(p))]

    with PeakRss(peers, period_s=0.5) as rss:
        if proc.wait() != 0:
            raise SystemExit(f"p2p-trainer local failed (exit {proc.returncode}); logs in {run_dir}")
    rounds = [read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds for i in range(PEERS)]
    return rounds, sorted(rss.peaks.values())


def swarm_rates(rounds: list[RoundRecord]) -> tuple[float, float]:
    """One peer's (inner-step tokens/s, overall tokens/s), its first round left out as warm-up
    where it has more than one."""
    timed = rounds[1:] if len(rounds) > 1 else rounds
    inner = sum(r.round_tokens for r in timed) / max(1e-9, sum(r.compute_s for r in timed))
    if len(rounds) > 1:
        overall = (rounds[-1].tokens - rounds[0].tokens) / max(1e-9, rounds[-1].time_s - rounds[0].time_s)
    else:
        overall = rounds[0].round_tokens / max(1e-9, rounds[0].wall_s)
    return inner, overall


def outer_memory(cfg: RunConfig) -> dict[str, int]:
    """What the outer state adds, from a peer built as the swarm's are (on the CPU: φ and m)."""
    from p2p_trainer.exchange.inprocess import InProcessSwarm
    from p2p_trainer.train.data import check_corpus
    from p2p_trainer.train.trainer import Peer

    peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), check_corpus(cfg), "peer0")
    m = peer.outer_memory()
    return {"anchor": m.anchor, "momentum": m.momentum, "staging": m.staging, "total": m.total}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=600.0, help="Wall time of each side.")
    p.add_argument("--tiny", action="store_true", help="Tiny sizes: check the script end to end.")
    p.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--paired-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=8, help="Paired steps of the in-process comparison.")
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--key", default="peer0", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bare_worker:
        bare_worker(args.config, args.key, args.seconds, args.out)
        return 0
    if args.paired_worker:
        paired_worker(args.config, args.steps, args.out)
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("P2P_TRAINER_CACHE", str(out / "token-cache"))  # children inherit it
    shape = TINY if args.tiny else FULL
    vocab = train_tokenizer(out, shape.vocab_size)
    cfg = run_config(dataclasses.replace(shape, vocab_size=vocab), out / "tokenizer.json", args.tiny)
    params = build_model(cfg.model, cfg.seed).num_params()
    if not args.tiny and params < MIN_PARAMS:
        raise SystemExit(f"the model has {params:,} parameters, fewer than {MIN_PARAMS:,}")
    config = out / "config.toml"
    config.write_text(to_toml(cfg))
    print(f"model: {params:,} parameters, vocabulary {vocab}; {args.seconds:.0f} s per side", flush=True)
    # half the bare time before the swarm and half after: the machine's speed drifts over minutes
    # (other tenants), and the mean of the two halves cancels a steady drift
    paired = run_paired(config, out, args.steps)
    before = run_bare(config, out, args.seconds / 2, "before")
    rounds, peer_rss = run_swarm(config, out, args.seconds)
    after = run_bare(config, out, args.seconds / 2, "after")
    bare = before + after
    rates = [swarm_rates(r) for r in rounds]
    halves = [sum(b["tokens"] / b["seconds"] for b in half) for half in (before, after)]
    bare_tps = sum(halves) / 2
    inner_tps, overall_tps = sum(r[0] for r in rates), sum(r[1] for r in rates)
    report = {
        "params": params,
        "vocab_size": vocab,
        "model_param_bytes": 4 * params,
        "outer_state_bytes": outer_memory(cfg),
        "bare_tokens_per_s": round(bare_tps, 1),
        "bare_tokens_per_s_before_after": [round(h, 1) for h in halves],
        "swarm_inner_tokens_per_s": round(inner_tps, 1),
        "swarm_overall_tokens_per_s": round(overall_tps, 1),
        "inner_ratio": round(inner_tps / bare_tps, 3),
        "overall_ratio": round(overall_tps / bare_tps, 3),
        "paired_in_process": {
            **paired,
            "ratio": round(paired["bare_s_per_step"] / paired["peer_s_per_step"], 3),
        },
        "rounds_per_peer": [len(r) for r in rounds],
        "bare_steps": [b["steps"] for b in bare],
        "bare_peak_rss_bytes": [b["peak_rss_bytes"] for b in bare],
        "peer_peak_rss_bytes": peer_rss,
        "seconds": args.seconds,
        "threads_per_worker": threads_per_worker(),
    }
    (out / "llama_cpu.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
