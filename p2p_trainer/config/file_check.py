"""`p2p-trainer config check`: every wrong field of a config file at once, not only the first.

Building a config stops at its first error, so the file is built again and again: each time the
field the error names is put back to its default, the default run's or the field's own (dropped
from the file's values), and the next error can show. Unknown keys are all listed before that,
each with the allowed names.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from p2p_trainer.config.checks import ConfigError
from p2p_trainer.config.run import OuterConfig, RunConfig
from p2p_trainer.config.sources import over_default_run
from p2p_trainer.config.toml_io import SECTIONS, TOP, moved_keys_hint, read_toml


def _unknown_keys(raw: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Problems with the file's keys, and its values without the unknown ones."""
    problems: list[str] = []
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        if key in TOP:
            kept[key] = value
        elif key not in SECTIONS:
            problems.append(f"unknown key {key!r}; allowed: {', '.join(sorted((*TOP, *SECTIONS)))}")
        elif not isinstance(value, dict):
            problems.append(f"[{key}] must be a table, not {value!r}")
        else:
            names = {f.name for f in dataclasses.fields(SECTIONS[key])}
            unknown = sorted(set(value) - names)
            outer = SECTIONS[key] is OuterConfig
            problems += [
                f"[{key}] unknown key {name!r}; allowed: {', '.join(sorted(names))}"
                + (moved_keys_hint({name}) if outer else "")
                for name in unknown
            ]
            kept[key] = {name: v for name, v in value.items() if name in names}
    return problems, kept


def _build(values: dict[str, Any]) -> RunConfig:
    """The run `values` describe, read over the default run as `load_config` reads a file."""
    merged, _ = over_default_run(values)
    tables = {key: SECTIONS[key](**value) for key, value in merged.items() if key in SECTIONS}
    return RunConfig(**{key: value for key, value in merged.items() if key in TOP}, **tables)


def _blamed(message: str, values: dict[str, Any]) -> tuple[str, str] | None:
    """The first field set in the file that `message` names: (table or "", field)."""
    for table, section in values.items():
        if table in TOP:
            if message.startswith(f"{table}="):
                return ("", table)
            continue
        for name in section:
            if re.search(rf"(?<![\w.]){table}\.{name}(?!\w)", message):
                return (table, name)
    return None


def check_config_file(path: str | Path) -> list[str]:
    """Every problem of config file `path`, one message each (empty: the file is valid)."""
    try:
        raw = read_toml(path)
    except ConfigError as exc:
        return [str(exc)]
    problems, values = _unknown_keys(raw)
    for _ in range(1 + sum(len(v) if isinstance(v, dict) else 1 for v in values.values())):
        try:
            _build(values)
            break
        except ConfigError as exc:
            problems.append(str(exc))
            blamed = _blamed(str(exc), values)
            if blamed is None:  # it names no value of the file: nothing to put back
                break
            table, name = blamed
            del (values[table] if table else values)[name]
    return problems
