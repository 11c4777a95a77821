"""Per-arm numbers over the report seeds: medians with min–max, relative throughput, fraction of ideal.

Everything is per seed first (an arm against the same seed's bare loop, independent arm and ideal
run), then summarised over seeds as a `Spread`.
"""

from __future__ import annotations

from typing import Any

from bench.wan.analysis import median
from bench.wan.budget import fmt_spread, fraction_of_ideal, spread
from bench.wan.targets import seed_comparison

EVAL_KEYS = (
    "mean_peer_loss",
    "consensus_loss",
    "best_peer_loss",
    "tokens_per_s_per_peer",
    "consensus_distance",
)
STAT_KEYS = (
    "utilisation",
    "round_time_s",
    "step_compute_s",
    "blocked_p50_s",
    "blocked_p95_s",
    "blocked_max_s",
    "tx_bytes_per_peer",
    "rx_bytes_per_peer",
    "theory_bytes_per_peer",
    "bytes_vs_theory",
    "control_bytes_per_peer",
    "exchange_bytes_vs_theory",
    "tx_bytes_per_peer_per_round",
    "partial_merges",
    "failed_exchanges",
)


def per_seed_values(
    runs: list[dict[str, Any]], ideal: dict[int, dict[str, Any]], seed: int
) -> dict[str, dict[str, Any]]:
    """Each arm's numbers for one seed, against that seed's bare loop, independent arm and ideal run."""
    by = {r["variant"]: r for r in runs if r["seed"] == seed}
    bare = by.get("bare", {}).get("eval", {}).get("tokens_per_s_per_peer")
    indep = by.get("independent", {}).get("eval", {})
    l_ind, tps_ind = indep.get("mean_peer_loss"), indep.get("tokens_per_s_per_peer")
    l_ideal = ideal.get(seed, {}).get("loss")
    cmp = seed_comparison({v: r["eval"].get("curve", []) for v, r in by.items()}, _budget(runs))
    out: dict[str, dict[str, Any]] = {}
    for v, r in by.items():
        e, st = r["eval"], r["stats"]
        tps = e.get("tokens_per_s_per_peer")
        row: dict[str, Any] = {k: e.get(k) for k in EVAL_KEYS}
        row.update({k: st.get(k) for k in STAT_KEYS})
        row["rounds_min"] = st.get("rounds_min", 0)
        row["exchange_time_vs_bound"] = st.get("exchange_time_vs_bound", {})
        row["transfer_time_vs_bound"] = st.get("transfer_time_vs_bound", {})
        row["start_skew_s"] = st.get("start_skew_s", {})
        landed = st.get("landed_at_step") or {}
        row["landed_at_step"] = landed.get("mean")
        row["landed_share"] = landed.get("share_of_rounds")
        row["throughput_vs_bare"] = tps / bare if tps and bare else None
        row["throughput_vs_independent"] = tps / tps_ind if tps and tps_ind else None
        for kind in ("mean_peer", "consensus", "best_peer"):
            row[f"fraction_of_ideal_{kind}"] = fraction_of_ideal(l_ind, e.get(f"{kind}_loss"), l_ideal)
        m = cmp.get("methods", {}).get(v, {})
        row["loss_at_equal_time"] = m.get("loss_at_equal_time")
        row["loss_at_equal_tokens"] = m.get("loss_at_equal_tokens")
        row["loss_at_equal_tokens_2"] = m.get("loss_at_equal_tokens_2")
        row["final_loss"] = m.get("final_loss")
        row["final_tokens"] = m.get("final_tokens")
        row["time_to_diloco_final_s"] = m.get("time_to_diloco_final_s")
        row["tokens_at_budget"] = sum(e.get("tokens") or []) or None
        row["load_before"], row["load_after"] = r["run"].get("load_before"), r["run"].get("load_after")
        out[v] = row
    return out


def summarise(
    runs: list[dict[str, Any]], names: list[str], seeds: list[int], ideal: dict[int, dict[str, Any]]
) -> tuple[dict[str, Any], list[Any]]:
    """Per arm: every per-seed number as {median, lo, hi, n} over the seeds, plus `per_seed`."""
    seeds_rows = {s: per_seed_values(runs, ideal, s) for s in seeds}
    summary: dict[str, Any] = {}
    for v in names:
        rows = [seeds_rows[s][v] for s in seeds if v in seeds_rows[s]]
        if not rows:
            continue
        keys = [k for k, x in rows[0].items() if not k.startswith("load_") and not isinstance(x, dict)]
        s: dict[str, Any] = {}
        for k in keys:
            sp = spread([r.get(k) for r in rows])
            s[k] = None if sp is None else sp.median
            s[f"{k}_range"] = None if sp is None else [sp.lo, sp.hi, sp.n]
        s["rounds_min"] = min(r["rounds_min"] for r in rows)
        for key in ("exchange_time_vs_bound", "transfer_time_vs_bound", "start_skew_s"):
            tags = sorted({t for r in rows for t in r[key]})
            s[key] = {t: median([r[key].get(t, {}).get("p50") for r in rows]) for t in tags}
        s["load_1min"] = [[r["load_before"][0], r["load_after"][0]] for r in rows if r.get("load_before")]
        s["per_seed"] = {sd: seeds_rows[sd][v] for sd in seeds if v in seeds_rows[sd]}
        summary[v] = s
    per_seed = [
        seed_comparison(
            {r["variant"]: r["eval"].get("curve", []) for r in runs if r["seed"] == sd}, _budget(runs)
        )
        for sd in seeds
    ]
    return summary, per_seed


def _budget(runs: list[dict[str, Any]]) -> float:
    return float(runs[0]["run"]["budget_s"]) if runs else 0.0


def _col(summary: dict[str, Any], v: str, key: str, spec: str = ".3f", scale: float = 1.0) -> str:
    rows = summary[v]["per_seed"].values()
    return fmt_spread([None if r.get(key) is None else r[key] * scale for r in rows], spec)


def headline(results: dict[str, Any]) -> str:
    """The head-to-head table: every number a median over the report seeds with (min–max) beside it."""
    meta, summary = results["meta"], results["summary"]
    lines = [
        f"Schedule: {meta['schedule']}; budget {meta['budget_s']:g} s after the shared start; report seeds "
        f"{meta['report_seeds']} (configs picked on tuning seeds {meta['tuning_seeds']}: {meta['picked']}); "
        f"{meta['peers']} peers, {meta['rate_mbit']:g} Mbit/s, {meta['cpu_cores']:g}-core caps, H = {meta['inner_steps']}.",
        "Medians over the report seeds, (min–max) beside them. Loss: validation nats/byte of the models at "
        "exactly the budget. Fraction of ideal: (L_independent − L) / (L_independent − L_ideal), L_ideal = "
        "exact in-process data-parallel for the independent arm's median steps.",
        "",
        "| arm | loss: mean of peers | consensus model | best peer | fraction of ideal: mean / consensus / best "
        "| loss at equal tokens | tokens/s/peer | ÷ bare loop | ÷ independent | utilisation (own timer) "
        "| MB sent / received per peer | partial merges | load 1-min before→after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in summary:
        frac = " / ".join(
            _col(summary, v, f"fraction_of_ideal_{k}", ".2f") for k in ("mean_peer", "consensus", "best_peer")
        )
        sent, received = (_col(summary, v, f"{d}_bytes_per_peer", ".1f", 1e-6) for d in ("tx", "rx"))
        mb = f"{sent} / {received}"
        load = ", ".join(f"{a:.1f}→{b:.1f}" for a, b in summary[v]["load_1min"])
        lines.append(
            f"| {v} | {_col(summary, v, 'mean_peer_loss')} | {_col(summary, v, 'consensus_loss')} "
            f"| {_col(summary, v, 'best_peer_loss')} | {frac} | {_col(summary, v, 'loss_at_equal_tokens')} "
            f"| {_col(summary, v, 'tokens_per_s_per_peer', '.0f')} | {_col(summary, v, 'throughput_vs_bare')} "
            f"| {_col(summary, v, 'throughput_vs_independent')} | {_col(summary, v, 'utilisation')} "
            f"| {mb} | {_col(summary, v, 'partial_merges', '.0f')} | {load} |"
        )
    ideal = results.get("ideal", {})
    if ideal:
        lines += [
            "",
            "Ideal (in-process data-parallel, same peers and data): "
            + "; ".join(
                f"seed {s}: {d['steps']} steps, loss {d['loss']:.3f}" for s, d in sorted(ideal.items())
            ),
        ]
    return "\n".join(lines).rstrip() + "\n"
