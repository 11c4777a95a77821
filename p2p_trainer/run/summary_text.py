"""The lines `p2p-trainer local` prints at the end of a run, from its summary (`local_swarm.summarize`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _loss(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _consensus_line(summary: dict[str, Any]) -> str:
    """The consensus model (mean of the final anchors) against the single peers' own models."""
    line = f"  averaged model: val loss {_loss(summary['averaged_model_val_loss'])} (consensus)"
    if summary["best_peer"] is not None:
        line += (
            f"; single peers before the final agreement: best {summary['best_peer']} "
            f"{_loss(summary['best_peer_val_loss'])}, mean {_loss(summary['mean_peer_val_loss'])}"
        )
    distance = summary["consensus_distance"]
    if distance is not None:
        line += f"; spread {distance:.4f} (after: {summary['final_distance']:.4f})"
    return line


def local_summary_lines(summary: dict[str, Any], peers: int, out: Path) -> list[str]:
    lines = [
        f"\nmethod {summary['method']}, {peers} peers, {summary['wall_s']:.0f} s, {summary['tokens']} tokens"
    ]
    for p in summary["per_peer"]:
        vl = _loss(p["val_loss"])
        if p["final_agreement"] is not None:
            vl += f" (own {_loss(p['own_val_loss'])}, final agreement {p['final_agreement']})"
        lines.append(
            f"  {p['peer']}: val loss {vl}, rounds {p['rounds']}, utilisation {p['utilisation']:.3f}, "
            f"sent {p['bytes_sent'] / 1e6:.1f} MB, received {p['bytes_received'] / 1e6:.1f} MB, "
            f"failed exchanges {p['failed_exchanges']}/{p['exchanges']}"
        )
    lines.append(_consensus_line(summary))
    alone = summary.get("independent")
    if alone is not None:
        lines.append(
            f"  independent peers (same data, {alone['wall_s']:.0f} s): mean val loss "
            f"{_loss(alone['mean_peer_val_loss'])}, best {_loss(alone['best_peer_val_loss'])}; "
            f"gain of the swarm's consensus {_loss(summary['gain_vs_independent'])} nats/byte"
        )
    lines.append(
        f"run directory: {out} (summary.json, val_loss.png, peer*/metrics.jsonl, peer*/checkpoint.safetensors)"
    )
    return lines
