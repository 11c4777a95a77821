"""The head-to-head's arms and their schedules.

Fixed arms: the bare torch loop, independent training, data-parallel, DiLoCo (whole model, and
Streaming DiLoCo with two fragments), NoLoCo and the shipped default (`default.toml` as it is).
Three families of alternatives, one member of each picked on the tuning seeds: our factored
method (Mix1 only, or Mix1 + Mix2 every K rounds), hivemind.Optimizer (averaging in the
background, its default, or blocking in `step`) and the candidates for the shipped default.
Every arm of ours but `default` sends `wire_dtype` on the wire, and hivemind sends float16
(`Float16Compression`).

Schedules, the same shape for every arm: `constant` (warm-up, then the peak rate to the end) or
`anneal` (warm-up, then cosine to `min_lr_ratio`, ending where that arm's pilot says it will be
when the budget runs out).
"""

from __future__ import annotations

import dataclasses
import math

from bench.wan.runs import CANONICAL, DEFAULT_METHOD, Variant
from p2p_trainer.config import RunConfig

LAND_AT = 5
"""`outer.land_at_step` of the default-land arms: blocking DiLoCo's all-reduce took 1.30 s
(p50) against 0.28 s inner steps on this testbed (bench/RESULTS.md, 5 Dec 2026), so 5 cover it."""
ENDLESS_STEPS = 1_000_000
"""Inner steps scheduled under `constant`: more than any arm reaches, so only the budget stops it."""


def arms(h: int, mix2_every: list[int], wire_dtype: str, align_rounds: bool = True) -> list[Variant]:
    """Every arm, fixed ones first; `family` marks the alternatives the tuning seeds choose between."""
    wire = {"wire_dtype": wire_dtype}
    align = {"align_rounds": align_rounds}  # ours only: the baselines are blocking, which aligns them
    out = [
        Variant("bare", "bare"),
        Variant("independent", "independent"),
        Variant("data-parallel", "data-parallel", {"num_inner_steps": 1, **CANONICAL, **wire}),
        Variant("diloco", "diloco", {**CANONICAL, **wire}),
        # Streaming DiLoCo: every fragment still synced every H steps, staggered by H / 2, each
        # exchange behind the next half-round's inner steps
        Variant(
            "diloco-stream-p2",
            "diloco",
            {"fragments": 2, "num_inner_steps": max(1, h // 2), **CANONICAL, **wire},
        ),
        Variant("noloco", "noloco", {**CANONICAL, **wire}),
        # what a user gets with no flags: the shipped config (method, wire format, quorum, all
        # of default.toml: overlapped DiLoCo landing from step 3, aligned), only H set
        # by the bench like every other arm's
        Variant("default", DEFAULT_METHOD),
        # the same with the blocking all-reduce it replaced (the shipped default until 6 Dec 2026)
        Variant(
            "default-blocking", DEFAULT_METHOD, {"overlap": False, "land_at_step": 0, "align_rounds": False}
        ),
        # overlapped, landing from step LAND_AT, without and with round alignment: with no barrier,
        # round starts drift apart and the group's all-reduce waits for its last member; aligned,
        # a peer that starts late leaves out steps instead
        *(
            Variant(
                f"default-land{LAND_AT}{'-align' if aligned else ''}",
                DEFAULT_METHOD,
                {"overlap": True, "land_at_step": LAND_AT, "align_rounds": aligned},
            )
            for aligned in (False, True)
        ),
        Variant("factored-mix1", "factored", {"mix2_rounds": 0, **align, **wire}, family="factored"),
    ]
    out += [
        Variant(
            f"factored-mix2-k{k}",
            "factored",
            {"mix2_rounds": 1, "mix2_every": k, "mix2_group_size": 0, **align, **wire},
            family="factored",
        )
        for k in mix2_every
    ]
    # candidates for the shipped default, all with the measured cheapest lossless-enough codec
    # (int8 Δ with error feedback: within 0.5 % of float32 per token at 3.9 × fewer bytes)
    int8 = {"update_codec": "int8", "wire_dtype": "float16"}
    out += [
        Variant("cand-diloco-int8", "diloco", {**CANONICAL, **int8}, family="candidate"),
        Variant(
            "cand-stream-int8",
            "diloco",
            {"fragments": 2, "num_inner_steps": max(1, h // 2), **CANONICAL, **int8},
            family="candidate",
        ),
        # the same over the direct data plane: the exchange behind the steps shares the peer's
        # CPU cap, and the direct plane spends less CPU per byte than p2pd (bench.loopback_vs_gloo)
        Variant(
            "cand-stream-int8-direct",
            "diloco",
            {"fragments": 2, "num_inner_steps": max(1, h // 2), "data_plane": "direct", **CANONICAL, **int8},
            family="candidate",
        ),
        Variant("cand-factored-int8", "factored", {**align, **int8}, family="candidate"),
        # DiLoCo whose all-reduce runs behind the next round's inner steps (one fragment)
        Variant(
            "cand-diloco-overlap-int8", "diloco", {"overlap": True, **CANONICAL, **int8}, family="candidate"
        ),
    ]
    out += [
        Variant("hivemind", "hivemind", {"delay_state_averaging": True}, family="hivemind"),
        Variant("hivemind-blocking", "hivemind", {"delay_state_averaging": False}, family="hivemind"),
    ]
    return out


def families(vs: list[Variant]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for v in vs:
        if v.family:
            out.setdefault(v.family, []).append(v.name)
    return out


def scheduled(cfg: RunConfig, schedule: str, total_steps: int | None = None) -> RunConfig:
    """`cfg` (one arm's) on the schedule: `constant`, or `anneal` with the cosine ending at `total_steps`."""
    h = cfg.outer.num_inner_steps
    if schedule == "constant":
        inner = dataclasses.replace(cfg.inner, min_lr_ratio=1.0)
        return dataclasses.replace(cfg, inner=inner, rounds=ENDLESS_STEPS // h)
    if schedule != "anneal" or not total_steps:
        raise ValueError(f"schedule {schedule!r} with total_steps={total_steps}")
    return dataclasses.replace(cfg, rounds=max(1, math.ceil(total_steps / h)))


def anneal_steps(steps_per_s: float | None, budget_s: float, warmup_steps: int) -> int | None:
    """The steps an arm reaches by the budget at its pilot's rate (at least its warm-up and one more)."""
    if not steps_per_s:
        return None
    return max(warmup_steps + 1, round(steps_per_s * budget_s))
