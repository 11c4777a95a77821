"""Reading and writing run configs as TOML, and the packaged default run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib

from p2p_trainer.config.checks import ConfigError, require
from p2p_trainer.config.run import OuterConfig, RunConfig
from p2p_trainer.config.sections import (
    DataConfig,
    ExchangeConfig,
    InnerConfig,
    LogConfig,
    ModelConfig,
    NetworkConfig,
)
from p2p_trainer.config.security import SecurityConfig

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "inner": InnerConfig,
    "outer": OuterConfig,
    "exchange": ExchangeConfig,
    "network": NetworkConfig,
    "security": SecurityConfig,
    "log": LogConfig,
}
"""RunConfig's tables, in the order `to_toml` writes them."""
TOP = ("seed", "rounds")
"""RunConfig's fields outside the tables, written first."""

MOVED_TO_EXCHANGE: dict[str, str] = {
    "exchange_timeout_s": "timeout_s",
    "quorum_fraction": "quorum_fraction",
    "quorum_wait_max_s": "quorum_wait_max_s",
    "grace_overlap_steps": "grace_overlap_steps",
    "grace_gamma": "grace_gamma",
    "grace_min_s": "grace_min_s",
    "grace_max_s": "grace_max_s",
    "mix1_grace_s": "mix1_grace_s",
    "wire_dtype": "wire_dtype",
}
"""[outer] keys of configs written before the [exchange] table existed, and their names there: the
error for such a file says where each key went instead of only listing what [outer] allows."""


def config_from_dict(raw: dict[str, Any], where: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts; unknown keys are errors naming the allowed ones."""
    kwargs: dict[str, Any] = {}
    top_fields = {f.name for f in dataclasses.fields(RunConfig)}
    for key, value in raw.items():
        require(key in top_fields, f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(top_fields))}")
        if key in SECTIONS:
            require(isinstance(value, dict), f"{where}: [{key}] must be a table")
            kwargs[key] = _section(SECTIONS[key], value, f"{where} [{key}]")
        else:
            kwargs[key] = value
    try:
        return RunConfig(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _section(cls: type, values: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    hint = moved_keys_hint(unknown) if cls is OuterConfig else ""
    require(
        not unknown, f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(names))}{hint}"
    )
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def moved_keys_hint(unknown: set[str]) -> str:
    """Where the old [outer] exchange keys among `unknown` live now ("" when there are none)."""
    moved = [
        f"{key} -> [exchange] {MOVED_TO_EXCHANGE[key]}" for key in sorted(unknown) if key in MOVED_TO_EXCHANGE
    ]
    notes = [f"; moved to the [exchange] table: {', '.join(moved)}"] if moved else []
    if "pause_bound_s" in unknown:
        notes.append(
            "; pause_bound_s is not set: it follows from [exchange] timeout_s, quorum_wait_max_s and grace_max_s"
        )
    return "".join(notes)


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's tables, as a dict (ConfigError when missing or not TOML)."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def default_config_text() -> str:
    """The default run's TOML, shipped as package data (the same in a checkout and an install)."""
    return resources.files("p2p_trainer.config").joinpath("default.toml").read_text(encoding="utf-8")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return f"[{', '.join(toml_value(v) for v in value)}]"
    return repr(value)


def to_toml(cfg: RunConfig) -> str:
    """The config as TOML (flat tables, every field), so every peer process loads exactly this run."""
    lines = [f"{key} = {getattr(cfg, key)}" for key in TOP]
    for name in SECTIONS:
        lines.append(f"\n[{name}]")
        for key, value in dataclasses.asdict(getattr(cfg, name)).items():
            if value is not None:
                lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def annotated_toml(cfg: RunConfig, notes: Mapping[str, str]) -> str:
    """`to_toml` with a comment after each value (`notes["data.batch_size"]`, e.g. where it came
    from); fields left unset appear as comments. Still valid TOML, of the same config."""
    rows: list[tuple[str, str]] = [(f"{key} = {getattr(cfg, key)}", notes.get(key, "")) for key in TOP]
    for name in SECTIONS:
        rows.append((f"\n[{name}]", ""))
        for key, value in dataclasses.asdict(getattr(cfg, name)).items():
            text = f"{key} = {toml_value(value)}" if value is not None else f"# {key} unset"
            rows.append((text, notes.get(f"{name}.{key}", "")))
    width = min(48, max(len(text) for text, note in rows if note))
    lines = [f"{text:<{width}}  # {note}" if note else text for text, note in rows]
    return "\n".join(lines) + "\n"
