"""The WAN bench's markdown table and PNG plots (loss vs time, loss vs tokens, utilisation)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _s(s: dict[str, Any], key: str, fmt: str = ".3f", scale: float = 1.0) -> str:
    """A summary value: the median over seeds, with (min–max) beside it where there are several."""
    v, r = s.get(key), s.get(f"{key}_range")
    if v is None:
        return "-"
    if r and r[2] > 1:
        return f"{v * scale:{fmt}} ({r[0] * scale:{fmt}}–{r[1] * scale:{fmt}})"
    return format(v * scale, fmt)


def markdown(results: dict[str, Any]) -> str:
    meta, summary = results["meta"], results["summary"]
    lines = [
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date_utc']}; machine: {meta['machine']}; load average at start / end: "
        f"{', '.join(f'{x:.1f}' for x in meta['load_avg_at_start'])} / "
        f"{', '.join(f'{x:.1f}' for x in meta.get('load_avg_at_end', ()))}",
        "",
        f"{meta['peers']} peers, {meta['rate_mbit']:g} Mbit/s links, {meta['cpu_cores']:g}-core caps, "
        f"H = {meta['inner_steps']}, {meta['budget_s']:.0f} s per run after the swarm's shared start "
        f"(every model taken at exactly that time), {meta.get('schedule', 'constant')} schedule, "
        f"report seeds {meta['seeds']}, "
        f"{meta['num_params']} parameters; medians over the report seeds (min–max)."
        + (" **Measured while the machine was loaded by other jobs.**" if meta.get("loaded") else "")
        + (" **One seed (the long-horizon check): no spread.**" if meta.get("long_run") else ""),
        "",
        "| method | val loss at equal time | at equal tokens | final | tokens | utilisation | compute s/step "
        "| blocked/round p50 / p95 / max (s) | MB sent/peer | bytes vs theory | exchange / bound (p50): "
        "per peer; whole group in | start skew p50 (s) | landed at step, in share of rounds | consensus dist. | rounds (min) "
        "| time to DiLoCo's final (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, s in summary.items():
        tr = s.get("transfer_time_vs_bound", {})
        ex = ", ".join(
            f"{t} {_f(r, '.2f')}; {_f(tr.get(t), '.2f')}"
            for t, r in s.get("exchange_time_vs_bound", {}).items()
        )
        skew = ", ".join(f"{t} {_f(x, '.2f')}" for t, x in s.get("start_skew_s", {}).items())
        lines.append(
            f"| {v} | {_s(s, 'loss_at_equal_time')} | {_s(s, 'loss_at_equal_tokens')} "
            f"| {_s(s, 'final_loss')} | {_s(s, 'final_tokens', '.3g')} | {_s(s, 'utilisation')} "
            f"| {_s(s, 'step_compute_s', '.2f')} "
            f"| {_s(s, 'blocked_p50_s', '.2f')} / {_s(s, 'blocked_p95_s', '.2f')} / "
            f"{_s(s, 'blocked_max_s', '.2f')} | {_s(s, 'tx_bytes_per_peer', '.1f', 1e-6)} "
            f"| {_s(s, 'bytes_vs_theory')} | {ex or '-'} | {skew or '-'} | {_s(s, 'landed_at_step', '.1f')} in {_s(s, 'landed_share', '.0%')} "
            f"| {_s(s, 'consensus_distance', '.4f')} "
            f"| {s.get('rounds_min')} | {_s(s, 'time_to_diloco_final_s', '.0f')} |"
        )
    lines += ["", "| target | measured (median) | per report seed | bound | met |", "|---|---|---|---|---|"]
    for t in results["targets"]:
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        seeds = ", ".join(_f(x) for x in t.get("per_seed") or []) or "-"
        lines.append(f"| {t['target']} | {_f(t['value'])} | {seeds} | {_f(t['bound'], 'g')} | {met} |")
    if results.get("sim"):
        t = results["sim"]["_terms"]
        lines += [
            "",
            f"Simulator terms (measured outside the compared runs): step {t['step_s']:.3f} s and round "
            f"overhead {t['round_overhead_s']:.2f} s (4-peer independent), link efficiency "
            f"{t['link_efficiency']:.3f} (2-peer DiLoCo), background-exchange CPU "
            f"{t['overlap_cpu_s_per_mb']:.3f} s/MB (2-peer Mix1 vs independent).",
            "",
            "| method | utilisation measured / predicted | round time (s) measured / predicted | within 15% |",
        ]
        lines.append("|---|---|---|---|")
        for v, c in results["sim"].items():
            if v.startswith("_"):
                continue
            ok = "yes" if c["within_15pct"] else "**no**"
            lines.append(
                f"| {v} | {_f(c['utilisation'])} / {_f(c['predicted_utilisation'])} "
                f"| {_f(c['round_time_s'], '.2f')} / {_f(c['predicted_round_time_s'], '.2f')} | {ok} |"
            )
    return "\n".join(lines) + "\n"


def _save(fig: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colours: dict[str, Any] = {}
    for key, label, fname in (
        ("time_s", "wall time (s)", "loss_vs_time.png"),
        ("tokens", "tokens (all peers)", "loss_vs_tokens.png"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        labelled: set[str] = set()  # one legend entry per arm and figure, one colour per arm
        for run in results["runs"]:
            curve, v = run["curve"], run["variant"]
            if not curve:
                continue
            kw: dict[str, Any] = {"color": colours[v]} if v in colours else {}
            if v not in labelled:
                kw["label"] = v
                labelled.add(v)
            (line,) = ax.plot([p[key] for p in curve], [p["val_loss"] for p in curve], lw=1.2, **kw)
            colours.setdefault(v, line.get_color())
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        _save(fig, out / fname)
        plt.close(fig)
        written.append(out / fname)
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(results["summary"])
    vals = [results["summary"][v].get("utilisation") or 0.0 for v in names]
    ax.bar(names, vals, color=[colours.get(v, "grey") for v in names])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("compute utilisation (median over seeds)")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    _save(fig, out / "utilisation.png")
    plt.close(fig)
    written.append(out / "utilisation.png")
    return written
