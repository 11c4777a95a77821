"""Comparisons across methods of one seed, medians over seeds, and the bench's targets as ratios."""

from __future__ import annotations

from typing import Any

from bench.wan.analysis import loss_at_time, loss_at_tokens, median, time_to_loss

Curve = list[dict[str, float]]


def seed_comparison(curves: dict[str, Curve], budget_s: float) -> dict[str, Any]:
    """At equal wall time (the budget; a run that finished its schedule earlier keeps its final
    loss) and at equal tokens (the fewest tokens any method processed). "DiLoCo's final loss" is
    its loss at the budget, as every method ran at least that long."""
    have = {k: c for k, c in curves.items() if c}
    if not have:
        return {}
    t_eq = budget_s
    tok_eq = min(c[-1]["tokens"] for c in have.values())
    # the second token point leaves out data-parallel (few steps on slow links)
    rest = [c[-1]["tokens"] for k, c in have.items() if k != "data-parallel"]
    tok_eq2 = min(rest) if rest else tok_eq
    out: dict[str, Any] = {
        "equal_time_s": t_eq,
        "equal_tokens": tok_eq,
        "equal_tokens_2": tok_eq2,
        "methods": {},
    }
    dl = have.get("diloco")
    # DiLoCo at the comparison time: its run may go on past it to reach --min-rounds
    dl_at = [p for p in dl if p["time_s"] <= t_eq] if dl else []
    dl_final = dl_at[-1]["val_loss"] if dl_at else None
    dl_tokens = dl_at[-1]["tokens"] if dl_at else None
    dl_time = time_to_loss(dl, dl_final) if dl and dl_final is not None else None
    for name, c in have.items():
        out["methods"][name] = {
            "final_loss": c[-1]["val_loss"],
            "final_tokens": c[-1]["tokens"],
            "loss_at_equal_time": loss_at_time(c, t_eq),
            "loss_at_equal_tokens": loss_at_tokens(c, tok_eq),
            "loss_at_equal_tokens_2": loss_at_tokens(c, tok_eq2),
            "loss_at_diloco_tokens": loss_at_tokens(c, dl_tokens) if dl_tokens else None,
            "time_to_diloco_final_s": time_to_loss(c, dl_final) if dl_final is not None else None,
        }
    out["diloco_final_loss"], out["diloco_time_to_final_s"] = dl_final, dl_time
    return out


def _m(per_seed: list[dict[str, Any]], method: str, key: str) -> float | None:
    return median([s.get("methods", {}).get(method, {}).get(key) for s in per_seed])


def targets(summary: dict[str, dict[str, Any]], per_seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bench's targets (bench/RESULTS.md), each with the measured value, the bound and whether it is met."""
    rows: list[dict[str, Any]] = []

    def add(
        name: str,
        value: float | None,
        bound: float | None,
        ok: bool | None,
        seeds: list[float | None] | None = None,
    ) -> None:
        rows.append({"target": name, "value": value, "bound": bound, "met": ok, "per_seed": seeds})

    def paired(a: str, b: str, key: str) -> list[float | None]:
        """a's value minus b's, seed by seed (the arms of a seed share its data streams)."""
        out: list[float | None] = []
        for sd in per_seed:
            x, y = (sd.get("methods", {}).get(v, {}).get(key) for v in (a, b))
            out.append(x - y if x is not None and y is not None else None)
        return out

    def u(v: str) -> float | None:
        # tokens/s against the bare loop's under the same cap: CPU a background exchange takes
        # from the inner steps counts against it (a peer's own timer would count it as compute)
        s = summary.get(v, {})
        return s.get("throughput_vs_bare", s.get("utilisation"))

    def u_seeds(v: str) -> list[float | None] | None:
        rows = summary.get(v, {}).get("per_seed", {}).values()
        return [r.get("throughput_vs_bare") for r in rows] or None

    # the shipped default where it ran (the targets are about what a user gets), else the factored
    # arm the tuning seeds picked (or the best of those reported)
    ours = [v for v in summary if v.startswith("factored")]
    best = min(ours, key=lambda v: _m(per_seed, v, "loss_at_equal_time") or 99.0) if ours else None
    best = "default" if "default" in summary else best
    f1, dl = u("factored-mix1"), u("diloco")
    add(
        "factored Mix1-only utilisation (tokens/s ÷ bare loop) >= 0.95",
        f1,
        0.95,
        None if f1 is None else f1 >= 0.95,
        u_seeds("factored-mix1"),
    )
    f16 = u("factored-mix1-fp16")  # the same with float16 on the wire, where it was run
    if f16 is not None:
        add("factored Mix1-only, float16 wire, utilisation >= 0.95", f16, 0.95, f16 >= 0.95)
    if f1 is not None and dl is not None:
        add("factored Mix1-only utilisation - DiLoCo's >= 0.3", f1 - dl, 0.3, f1 - dl >= 0.3)
    if best is not None:
        ub = u(best)
        add(
            f"{best} utilisation (tokens/s ÷ bare loop) >= 0.9",
            ub,
            0.9,
            None if ub is None else ub >= 0.9,
            u_seeds(best),
        )
        d = paired(best, "diloco", "loss_at_diloco_tokens")
        if (dm := median(d)) is not None:
            add(f"{best} loss - DiLoCo's at DiLoCo's tokens <= 0.03", dm, 0.03, dm <= 0.03, d)
        ratios = []
        for s in per_seed:
            t_f = s.get("methods", {}).get(best, {}).get("time_to_diloco_final_s")
            t_d = s.get("diloco_time_to_final_s")
            ratios.append(t_f / t_d if t_f is not None and t_d else None)
        r = median(ratios)
        add(
            f"{best} time to DiLoCo's final loss / DiLoCo's <= 0.6",
            r,
            0.6,
            None if r is None else r <= 0.6,
            ratios,
        )
        hm = next((v for v in summary if v.startswith("hivemind")), "hivemind")
        for other, margin in (("independent", 0.1), (hm, 0.3)):
            d = paired(other, best, "loss_at_equal_time")
            if (dm := median(d)) is not None:
                add(f"{other} - {best} loss at equal time >= {margin}", dm, margin, dm >= margin, d)
    # two timings of one exchange: a peer's own (from its start, so it includes waiting for members
    # that came later) and the group's (from its last member's start: the exchange itself)
    pairs = [("diloco", "outer"), ("noloco", "noloco"), ("data-parallel", "grad"), ("factored-mix1", "mix1")]
    pairs += [(best, "mix2"), (best, "mix1")] if best is not None else []
    for v, tag in pairs:
        for key, what in (
            ("exchange_time_vs_bound", "per peer"),
            ("transfer_time_vs_bound", "whole group in"),
        ):
            r = summary.get(v, {}).get(key, {}).get(tag)
            if r is not None:
                add(
                    f"{v} {tag} exchange time ({what}) / (bytes / link rate) <= 1.15 (p50)",
                    r,
                    1.15,
                    r <= 1.15,
                )
    return rows


def sanity(summary: dict[str, dict[str, Any]], per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """What the --quick integration test checks: the pipeline measured sensible numbers."""
    at_tokens = {v: _m(per_seed, v, "loss_at_equal_tokens") for v in summary}
    known = {v: x for v, x in at_tokens.items() if x is not None}
    # independent vs the other methods at the most tokens they all processed (data-parallel aside;
    # the bare loop is independent training without a node, so it is left out of "worst")
    at_tokens_2 = {
        v: _m(per_seed, v, "loss_at_equal_tokens_2") for v in summary if v not in ("bare", "data-parallel")
    }
    known_2 = {v: x for v, x in at_tokens_2.items() if x is not None}
    # what the exchanges moved (payload less the control plane that every node moves, measured by
    # the independent run), against theory; the raw payload ratio where there is no such run
    bytes_ratio = {
        v: s.get("exchange_bytes_vs_theory") or s["bytes_vs_theory"]
        for v, s in summary.items()
        # hivemind's bytes follow its own protocol (matchmaking, state downloads), not the butterfly's
        if s.get("bytes_vs_theory") is not None and not v.startswith("hivemind")
    }
    return {
        "loss_at_equal_tokens": at_tokens,
        "data_parallel_best_per_token": bool(known) and min(known, key=lambda v: known[v]) == "data-parallel",
        "loss_at_equal_tokens_2": at_tokens_2,
        "independent_worst_per_token": bool(known_2)
        and max(known_2, key=lambda v: known_2[v]) == "independent",
        "bytes_vs_theory": bytes_ratio,
        "bytes_within_5pct": bool(bytes_ratio) and all(abs(r - 1) <= 0.05 for r in bytes_ratio.values()),
    }
