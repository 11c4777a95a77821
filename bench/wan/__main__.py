"""Head-to-head on the emulated WAN: our methods vs DiLoCo, NoLoCo, data-parallel, independent
training, hivemind.Optimizer and a bare torch loop; same model, data streams, seed and inner optimizer.

    python -m bench.wan --out runs/wan                       # constant LR after warm-up
    python -m bench.wan --schedule anneal --out runs/wan-a   # cosine ending at each arm's budget
    python -m bench.wan --quick --out runs/wanq              # a few minutes, one seed
    python -m bench.wan --scaling --out runs/wans            # 2/4/8 peers

Each (arm, seed) gets a fresh testbed (N peers in namespaces, capped links and CPUs; a bootstrap
node for the arms that need one). Peer k of every arm reads data stream `slot{k}`. Every peer of
a run trains for the same budget after the swarm's shared start and is stopped there; its model
at exactly the budget is evaluated (bench/wan/budget.py, evaluate.py). Configs with alternatives
(which factored variant, which hivemind averaging mode) are picked on `--tuning-seeds` and
reported on `--report-seeds`; arms are interleaved per seed, the order reversed every seed, and
the 1-minute load is recorded before and after each run. The ideal (exact in-process
data-parallel, same peers and streams, the independent arm's median step count) gives the
fraction of ideal collaboration each arm retains. Writes results.json, table.md and plots to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.wan.analysis import Evaluator, add_exchange_bytes, fragment_params, run_stats
from bench.wan.budget import interleaved, pick_best, split_seeds
from bench.wan.evaluate import budget_eval, prune_snapshots
from bench.wan.ideal import ideal_config, run_ideal
from bench.wan.plan import anneal_steps, arms, families, scheduled
from bench.wan.runs import SwarmSpec, Variant, run_swarm, variant_config
from bench.wan.scaling import run_scaling, scaling_markdown
from bench.wan.sim_check import calibrate, sim_comparison
from bench.wan.summary import headline, summarise
from bench.wan.tables import markdown, plots
from bench.wan.targets import sanity, targets
from p2p_trainer.config import RunConfig, load_config
from p2p_trainer.exchange.codecs import from_config
from p2p_trainer.lab.testbed import support_problem
from p2p_trainer.train.model import build_model

logger = logging.getLogger(__name__)
LONG_RUN_S = 900.0
"""Issue 12's long-horizon check: one seed is allowed at this budget or more."""
QUICK_ARMS = ("bare", "independent", "data-parallel", "diloco", "factored-mix2-k2", "hivemind")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs") / f"wan-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--quick", action="store_true", help="Small model, short runs, one report seed, 6 arms.")
    p.add_argument("--schedule", choices=("constant", "anneal"), default="constant")
    p.add_argument("--tuning-seeds", type=int, nargs="*", default=None, help="Default 100 101 (quick: none).")
    p.add_argument("--report-seeds", type=int, nargs="+", default=None, help="Default 0 1 2 (quick: 0).")
    p.add_argument(
        "--budget-s", type=float, default=None, help="Training time per run (default 220, quick 40)."
    )
    p.add_argument(
        "--pilot-s", type=float, default=None, help="Pilot length for --schedule anneal (60; quick 20)."
    )
    p.add_argument("--inner-steps", type=int, default=None, help="H (default 10).")
    p.add_argument("--mix2-every", type=int, nargs="+", default=[4], help="K values for factored Mix1+Mix2.")
    p.add_argument("--arms", nargs="+", default=None, help="Subset of arm names (default: all).")
    p.add_argument("--wire-dtype", choices=("float16", "float32"), default="float16")
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--rate-mbit", type=float, default=10.0)
    p.add_argument("--cpu-cores", type=float, default=0.45)
    p.add_argument("--points", type=int, default=None, help="Evaluation times per run (12; quick 8).")
    p.add_argument("--keep-snapshots", action="store_true", help="Keep snapshots the evaluation did not use.")
    p.add_argument(
        "--no-align-rounds",
        action="store_true",
        help="Factored arms without outer.align_rounds (the default arms set their own).",
    )
    p.add_argument("--scaling", action="store_true", help="2/4/8 peers, all-peer rounds vs random pairs.")
    p.add_argument("--analyse-only", action="store_true", help="Re-analyse the runs already in --out.")
    p.add_argument(
        "--resume",
        action="store_true",
        help="Keep every run (and ideal run) already evaluated in --out; run only the missing ones.",
    )
    p.add_argument("--loaded", action="store_true", help="Label the results as measured on a loaded machine.")
    p.add_argument(
        "--tune-only",
        action="store_true",
        help="Run only the tuning seeds of the arms' families; write tuning.json with the picks.",
    )
    p.add_argument("--calibration", action="store_true", help="Also run the simulator's 2-peer calibration.")
    p.add_argument(
        "--long-run",
        action="store_true",
        help=f"Allow one report seed where --budget-s >= {LONG_RUN_S:.0f}: the long-horizon check, labelled as one seed.",
    )
    args = p.parse_args(argv)
    if args.long_run and (args.budget_s or 0) < LONG_RUN_S:
        p.error(
            f"--long-run needs --budget-s {LONG_RUN_S:.0f} or more (a short run must have 3 report seeds)"
        )
    q = args.quick
    args.tuning_seeds = args.tuning_seeds if args.tuning_seeds is not None else ([] if q else [100, 101])
    args.report_seeds = args.report_seeds or ([0] if q else [0, 1, 2])
    args.pilot_s = args.pilot_s or (20.0 if q else 60.0)
    args.points = args.points or (8 if q else 12)
    args.inner_steps = args.inner_steps or 10
    if q and args.mix2_every == [4]:
        args.mix2_every = [2]
    return args


def base_config(quick: bool) -> RunConfig:
    cfg = load_config()  # the packaged default run
    cfg = dataclasses.replace(cfg, inner=dataclasses.replace(cfg.inner, eval_every=0))
    if quick:  # a model small enough that data-parallel takes enough steps in seconds
        model = dataclasses.replace(cfg.model, d_model=48, n_layers=2, seq_len=64)
        cfg = dataclasses.replace(cfg, model=model, inner=dataclasses.replace(cfg.inner, warmup_steps=5))
    return cfg


class Bench:
    """Runs (or re-reads) arms on seeds and evaluates them; remembers every run it did."""

    def __init__(self, args: argparse.Namespace, spec: SwarmSpec) -> None:
        self.args, self.spec = args, spec
        self.cfg0 = base_config(args.quick)
        self.ev = Evaluator(self.cfg0)
        self.total_steps: dict[str, int | None] = {}
        """--schedule anneal: each arm's cosine length, from its pilot."""
        self.init_losses: dict[int, float] = {}

    def init_loss(self, seed: int) -> float:
        """Validation loss of the seed's initial model: every arm's starting point."""
        if seed not in self.init_losses:
            model = build_model(self.cfg0.model, seed)
            self.init_losses[seed] = self.ev.loss([p.detach() for p in model.parameters()])
        return self.init_losses[seed]

    def config(self, v: Variant, seed: int, schedule: str) -> RunConfig:
        cfg = variant_config(
            dataclasses.replace(self.cfg0, seed=seed), v, self.args.inner_steps, self.spec.timeout_s
        )
        return scheduled(cfg, schedule, self.total_steps.get(v.name))

    def run(
        self, v: Variant, seed: int, phase: str, spec: SwarmSpec, schedule: str, points: int
    ) -> dict[str, Any]:
        run_dir = self.args.out / phase / f"{v.name}-s{seed}"
        cfg = self.config(v, seed, schedule)
        saved = run_dir / "eval.json"
        if (self.args.analyse_only or self.args.resume) and saved.exists():
            return json.loads(saved.read_text())
        logger.info("%s: %s seed %d (%s)", phase, v.name, seed, run_dir)
        run = (
            json.loads((run_dir / "run.json").read_text())
            if self.args.analyse_only
            else run_swarm(v, cfg, spec, run_dir)
        )
        value_bytes = 2.0 if v.method == "hivemind" else update_value_bytes(cfg)
        stats = run_stats(
            run_dir, run, spec.peers, spec.rate_mbit, spec.budget_s, self.ev.num_params, value_bytes,
            fragment_params(cfg),
        )  # fmt: skip
        ev = budget_eval(run_dir, run, spec.peers, self.ev, points, self.init_loss(seed))
        if not self.args.keep_snapshots:
            prune_snapshots(run_dir, spec.peers, ev["used_snapshots"])
        entry = {"variant": v.name, "seed": seed, "phase": phase, "run": run, "stats": stats, "eval": ev}
        entry["curve"] = ev["curve"]
        saved.write_text(json.dumps(entry, indent=1))
        logger.info(
            "  %s: loss at budget %s, %s tokens/s/peer, utilisation (own timer) %s, load %.1f -> %.1f",
            v.name, ev.get("mean_peer_loss"), ev.get("tokens_per_s_per_peer"), stats["utilisation"],
            run["load_before"][0], run["load_after"][0],
        )  # fmt: skip
        return entry

    def pilots(self, vs: list[Variant], seed: int) -> dict[str, Any]:
        """--schedule anneal: a short constant-rate run of each arm; its steps/s sets the cosine length."""
        spec = dataclasses.replace(self.spec, budget_s=self.args.pilot_s)
        out = {}
        for v in vs:
            e = self.run(v, seed, "pilots", spec, "constant", 1)
            rate = e["eval"].get("steps_per_s")
            self.total_steps[v.name] = anneal_steps(rate, self.spec.budget_s, self.cfg0.inner.warmup_steps)
            out[v.name] = {"steps_per_s": rate, "total_steps": self.total_steps[v.name]}
            logger.info(
                "  pilot %s: %s steps/s -> cosine over %s steps", v.name, rate, self.total_steps[v.name]
            )
        return out

    def seeds(self, vs: list[Variant], seeds: list[int], phase: str) -> list[dict[str, Any]]:
        by_name = {v.name: v for v in vs}
        runs = []
        for n, seed in enumerate(seeds):
            for name in interleaved([v.name for v in vs], n):
                runs.append(
                    self.run(by_name[name], seed, phase, self.spec, self.args.schedule, self.args.points)
                )
        return runs

    def ideal(self, runs: list[dict[str, Any]], seed: int) -> dict[str, Any] | None:
        """In-process data-parallel for the seed's independent arm's median step count."""
        indep = [
            r for r in runs if r["variant"] == "independent" and r["seed"] == seed and r["eval"].get("steps")
        ]
        if not indep:
            return None
        path = self.args.out / "ideal" / f"s{seed}.json"
        steps = int(statistics.median(indep[0]["eval"]["steps"]))
        if self.args.analyse_only and path.exists():
            return dict(json.loads(path.read_text()))
        if self.args.resume and path.exists():
            kept = dict(json.loads(path.read_text()))
            if kept.get("steps") == steps:  # an independent run done again ran other steps
                return kept
        cfg = ideal_config(dataclasses.replace(self.cfg0, seed=seed), steps, self.args.schedule == "anneal")
        logger.info(
            "ideal: seed %d, %d data-parallel steps of %d peers in-process", seed, steps, self.spec.peers
        )
        t = time.monotonic()
        model, tokens = run_ideal(cfg, self.spec.peers, steps)
        out = {"steps": steps, "tokens": tokens, "loss": self.ev.loss(model), "wall_s": time.monotonic() - t}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out))
        return out


def update_value_bytes(cfg: RunConfig) -> float:
    """Bytes per value of the run's exchanges of updates, which the byte statistics' theory counts:
    the codec's own payload size (blockwise scales included) over a whole number of blocks."""
    codec, _ = from_config(cfg.exchange, update=True)
    n = codec.block * 1024
    return codec.payload_bytes(n) / n


def choose(
    bench: Bench, candidates: list[Variant], fams: dict[str, list[str]]
) -> tuple[dict[str, str], list[Any]]:
    """Per family, the member with the lowest median loss at the budget on the tuning seeds."""
    if not bench.args.tuning_seeds:
        return {f: names[0] for f, names in fams.items()}, []
    runs = bench.seeds(candidates, bench.args.tuning_seeds, "tuning")
    picked = {}
    for f, names in fams.items():
        losses = {n: [r["eval"].get("mean_peer_loss") for r in runs if r["variant"] == n] for n in names}
        picked[f] = pick_best(losses) or names[0]
    return picked, [
        {"variant": r["variant"], "seed": r["seed"], "loss": r["eval"].get("mean_peer_loss")} for r in runs
    ]


def head_to_head(args: argparse.Namespace, meta: dict[str, Any]) -> dict[str, Any]:
    split_seeds(args.tuning_seeds, args.report_seeds, min_report=1 if args.quick or args.long_run else 3)
    spec = SwarmSpec(
        args.peers, args.rate_mbit, args.cpu_cores, args.budget_s, timeout_s=15.0 if args.quick else 30.0
    )
    bench = Bench(args, spec)
    wanted = args.arms or (QUICK_ARMS if args.quick else None)
    every = arms(args.inner_steps, args.mix2_every, args.wire_dtype, not args.no_align_rounds)
    unknown = sorted(set(wanted or ()) - {v.name for v in every})
    if unknown:
        raise SystemExit(f"unknown --arms {unknown}; the arms are: {', '.join(v.name for v in every)}")
    vs = [v for v in every if wanted is None or v.name in wanted]
    fams = families(vs)
    candidates = [v for v in vs if v.family]
    if args.schedule == "anneal":
        meta["pilots"] = bench.pilots(vs, (args.tuning_seeds or args.report_seeds)[0])
    picked, tuning = choose(bench, candidates, fams)
    if args.tune_only:
        return {"meta": meta, "picked": picked, "tuning": tuning}
    report = [v for v in vs if not v.family or picked.get(v.family) == v.name]
    runs = bench.seeds(report, args.report_seeds, "report")
    add_exchange_bytes(runs)
    ideal = {s: d for s in args.report_seeds if (d := bench.ideal(runs, s)) is not None}
    names = [v.name for v in report]
    summary, per_seed = summarise(runs, names, args.report_seeds, ideal)
    meta.update(picked=picked, tuning=tuning, num_params=bench.ev.num_params, load_avg_at_end=os.getloadavg())
    results: dict[str, Any] = {
        "meta": meta,
        "summary": summary,
        "per_seed": per_seed,
        "runs": runs,
        "ideal": ideal,
    }
    results["targets"] = targets(summary, per_seed)
    results["sanity"] = sanity(summary, per_seed)
    results["hivemind_lr"] = hivemind_lr_check(
        args.out / "report", [v.name for v in report if v.method == "hivemind"]
    )
    if args.calibration and "independent" in summary:
        terms = calibrate(bench.cfg0, spec, args.inner_steps, args.out, bench.ev.num_params)
        results["sim"] = sim_comparison(
            summary, spec, args.inner_steps, bench.ev.num_params, args.mix2_every, terms
        )
    return results


def hivemind_lr_check(report_dir: Path, names: list[str]) -> dict[str, Any]:
    """Did the hivemind arm's torch optimizer hold the scheduled rate at every logged step?"""
    worst, n = 0.0, 0
    for name in names:
        for trace in report_dir.glob(f"{name}-s*/peer*/lr.jsonl"):
            for line in trace.read_text().splitlines():
                d = json.loads(line)
                worst, n = max(worst, abs(d["held"] - d["set"]) / max(1e-12, d["set"])), n + 1
    return {"steps_checked": n, "max_relative_error": worst, "ok": n > 0 and worst < 1e-6}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    problem = support_problem()
    if problem is not None:
        print(f"cannot run the WAN testbed here: {problem}")
        return 2
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.scaling:
        args.budget_s = args.budget_s or (40.0 if args.quick else 220.0)
    meta = {
        "command": " ".join(["python -m bench.wan", *(argv if argv is not None else sys.argv[1:])]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "load_avg_at_start": os.getloadavg(), "loaded": args.loaded,
        "long_run": args.long_run, "align_rounds": not args.no_align_rounds,
        "peers": args.peers, "rate_mbit": args.rate_mbit, "cpu_cores": args.cpu_cores,
        "schedule": args.schedule, "budget_s": args.budget_s, "inner_steps": args.inner_steps,
        "tuning_seeds": args.tuning_seeds, "report_seeds": args.report_seeds, "seeds": args.report_seeds,
        "mix2_every": args.mix2_every, "wire_dtype": args.wire_dtype,
    }  # fmt: skip
    if args.scaling:  # its own default budget (run_scaling)
        sc = run_scaling(args, base_config(args.quick))
        meta["load_avg_at_end"] = os.getloadavg()
        (args.out / "scaling.json").write_text(json.dumps({"meta": meta, **sc}, indent=2))
        (args.out / "scaling.md").write_text(scaling_markdown(sc))
        print(scaling_markdown(sc))
        return 0
    results = head_to_head(args, meta)
    if args.tune_only:
        (args.out / "tuning.json").write_text(json.dumps(results, indent=1))
        print(json.dumps({"picked": results["picked"], "tuning": results["tuning"]}, indent=1))
        return 0
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    table = headline(results) + "\n" + markdown(results)
    (args.out / "table.md").write_text(table)
    plots(results, args.out)
    print(table)
    print("sanity:", json.dumps(results["sanity"]))
    print("hivemind learning rate applied:", json.dumps(results["hivemind_lr"]))
    for t in results["targets"]:
        print(f"target {t['target']}: {t['value']} (bound {t['bound']}) {'MET' if t['met'] else 'MISSED'}")
    print(
        f"output: {args.out} (results.json, table.md, loss_vs_time.png, loss_vs_tokens.png, utilisation.png)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
