"""Peak memory of a peer's data path against the corpus's size: it must not grow with the corpus.

Generates, under /tmp, a 10 MB corpus in each measured format (a directory of text files, a .bin
of uint16 ids, a `datasets` directory) and two large ones (a .bin of `--big-gb` GB of random uint16
ids written in chunks, a `datasets` directory of `--dataset-mb` MB). For each, a fresh process does
what a `join` peer does with its data: the run id (hashes the corpus), `check_corpus` (every
check; writes the token cache), `load_corpus`, `--batches` training batches of its stream and the
validation batches; it reports its peak RSS (getrusage ru_maxrss). Each corpus is measured twice:
"cold", with an empty token cache (the process writes it), and "warm" (a later peer or restart).
The ratios are against the 10 MB text corpus and against the 10 MB corpus of the same format (the
`datasets` package alone costs a fixed ~70 MB to import, paid on a cold cache only); the target
is within 10 %. The generated files are deleted at the end (`--keep` keeps them).

    .venv/bin/python -m bench.data_memory --out runs/data-memory [--big-gb 2.1] [--dataset-mb 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MB = 1 << 20
CHUNK_IDS = 32 * MB
"""uint16 ids generated and written at a time (64 MB)."""
SEQ_LEN, BATCH_SIZE, TOKEN_VOCAB = 256, 16, 50304
TARGET = 1.10


def random_text(rng: np.random.Generator, n_bytes: int) -> str:
    """Lowercase letters and spaces: text in every byte-level format, cheap to make in bulk."""
    letters = rng.integers(0, 27, n_bytes, dtype=np.uint8)
    return np.where(letters == 26, 32, letters + 97).astype(np.uint8).tobytes().decode()


def make_text_dir(path: Path, n_bytes: int, files: int = 20) -> None:
    path.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(files):
        (path / f"doc{i:02d}.txt").write_text(random_text(rng, n_bytes // files))


def make_tokens(path: Path, n_bytes: int) -> None:
    rng = np.random.default_rng(2)
    left = n_bytes // 2
    with open(path, "wb") as f:
        while left:
            n = min(left, CHUNK_IDS)
            f.write(rng.integers(0, TOKEN_VOCAB, n, dtype=np.uint16).tobytes())
            left -= n


def make_dataset(path: Path, n_bytes: int, row_bytes: int = 1000) -> None:
    """A Dataset saved with save_to_disk, in shards of 100 MB, built a slice of rows at a time."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    rng = np.random.default_rng(3)
    parts, left = [], n_bytes // row_bytes
    while left:
        n = min(left, 20_000)
        text = random_text(rng, row_bytes * n)
        parts.append(
            datasets.Dataset.from_dict(
                {"text": [text[i : i + row_bytes] for i in range(0, len(text), row_bytes)]}
            )
        )
        left -= n
    datasets.concatenate_datasets(parts).save_to_disk(str(path), max_shard_size="100MB")


MAKERS = {"text": make_text_dir, "tokens": make_tokens, "datasets": make_dataset}


def disk_bytes(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


def vm_hwm_kb() -> int:
    """This process's own peak RSS (its address space's high-water mark, from /proc). ru_maxrss can
    also hold the parent's peak: a vfork'ed child inherits it at exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One peer's data path, in this process; returns its peak RSS."""
    from p2p_trainer.config import DataConfig, ModelConfig, RunConfig
    from p2p_trainer.train.data import TokenStream, check_corpus, load_corpus, validation_batches

    cfg = RunConfig(
        model=ModelConfig(vocab_size=spec["vocab"], d_model=32, n_heads=2, seq_len=SEQ_LEN),
        data=DataConfig(corpus=spec["corpus"], batch_size=BATCH_SIZE, val_batches=8),
    )
    t0 = time.perf_counter()
    run_id = cfg.run_id()
    check_corpus(cfg)
    corpus = load_corpus(cfg.data, SEQ_LEN)
    ready = time.perf_counter() - t0
    stream = TokenStream(corpus.train, SEQ_LEN, BATCH_SIZE, cfg.seed, "peer0")
    tokens = sum(int(stream.next_batch()[0].numel()) for _ in range(spec["batches"]))
    val = validation_batches(corpus, SEQ_LEN, BATCH_SIZE, cfg.data.val_batches)
    return {
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "vm_hwm_mb": vm_hwm_kb() / 1024,
        "ready_s": round(ready, 1),
        "run_id": run_id,
        "train_ids": len(corpus.train),
        "val_ids": len(corpus.val),
        "tokens_drawn": tokens + sum(int(x.numel()) for x, _ in val),
    }


def in_child(*args: str, env: dict[str, str] | None = None) -> str:
    """Runs this module with `args` in a fresh process. Corpora are made there too, so that this
    process stays small: a child's ru_maxrss starts from its parent's."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.data_memory", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def measure(spec: dict[str, Any], cache: Path) -> dict[str, Any]:
    return dict(json.loads(in_child("--child", json.dumps(spec), env={"P2P_TRAINER_CACHE": str(cache)})))


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's peak RSS over the small text corpus's and the small corpus's of its format, in
    the same phase."""
    base = {(r["format"], r["phase"]): r["peak_rss_mb"] for r in rows if r["small"]}
    for r in rows:
        r["vs_text"] = r["peak_rss_mb"] / base[("text", r["phase"])]
        r["vs_same_format"] = r["peak_rss_mb"] / base[(r["format"], r["phase"])]


def report(rows: list[dict[str, Any]], small_mb: int) -> str:
    lines = [
        f"| corpus | on disk | phase | peak RSS (ru_maxrss) | VmHWM | vs {small_mb} MB text "
        f"| vs {small_mb} MB same format | ready |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['disk_bytes'] / MB:,.0f} MB | {r['phase']} | {r['peak_rss_mb']:.0f} MB "
            f"| {r['vm_hwm_mb']:.0f} MB | {r['vs_text']:.3f} | {r['vs_same_format']:.3f} | {r['ready_s']} s |"
        )
    worst = max(r["vs_same_format"] for r in rows)
    return "\n".join(lines) + (
        f"\n\nlargest growth over the same format's {small_mb} MB corpus: {worst:.3f} (target <= {TARGET})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="where data_memory.json and data_memory.md go")
    ap.add_argument("--big-gb", type=float, default=2.1, help="size of the generated .bin")
    ap.add_argument("--dataset-mb", type=int, default=300, help="size of the generated datasets dir")
    ap.add_argument("--small-mb", type=int, default=10)
    ap.add_argument("--batches", type=int, default=200, help="training batches each process draws")
    ap.add_argument("--keep", action="store_true", help="keep the generated corpora")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--make", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.make:
        MAKERS[args.make[0]](Path(args.make[1]), int(args.make[2]))
        return
    if not args.out:
        ap.error("--out is required")
    work = Path(tempfile.mkdtemp(prefix="p2p-data-memory-", dir="/tmp"))
    small = args.small_mb * MB
    big_bin, big_ds = int(args.big_gb * 1024 * MB), args.dataset_mb * MB
    cases = [  # (name, format, vocab, path, size, small)
        (f"text dir, {args.small_mb} MB", "text", 256, work / "text", small, True),
        (f".bin, {args.small_mb} MB", "tokens", TOKEN_VOCAB, work / "small.bin", small, True),
        (f"datasets, {args.small_mb} MB", "datasets", 256, work / "small-ds", small, True),
        (f".bin, {args.big_gb} GB", "tokens", TOKEN_VOCAB, work / "big.bin", big_bin, False),
        (f"datasets, {args.dataset_mb} MB", "datasets", 256, work / "big-ds", big_ds, False),
    ]
    rows = []
    try:
        for name, fmt, vocab, path, size, is_small in cases:
            in_child("--make", fmt, str(path), str(size))
            spec = {"corpus": str(path), "vocab": vocab, "batches": args.batches}
            for phase in ("cold", "warm"):  # the first writes the token cache, the second reads it
                got = measure(spec, work / f"cache-{path.name}")
                rows.append({"name": name, "format": fmt, "phase": phase, "small": is_small, **got})
                rows[-1]["disk_bytes"] = disk_bytes(path)
                print(f"{name:24} {phase}: peak RSS {got['peak_rss_mb']:.0f} MB ({got['ready_s']} s)")
            if not is_small and not args.keep:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    add_ratios(rows)
    table = report(rows, args.small_mb)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_memory.json").write_text(json.dumps(rows, indent=1))
    (out / "data_memory.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
