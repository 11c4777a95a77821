"""One generic type check for every config dataclass: each field's value against its annotation.

A wrong type fails at construction with a `ConfigError` naming the field (`data.batch_size=8.5:
expected an integer`), whatever the source (Python, TOML or command-line flags). Lists become
tuples and integers become floats where the annotation says so, so a config built from TOML equals
the same config built in Python.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says what to change."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def choices(literal: Any) -> tuple[str, ...]:
    """The values of a `Literal[...]` type, in order."""
    return tuple(get_args(literal))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _convert(value: object, hint: Any, name: str) -> object:
    """`value` checked against `hint` (and normalised: int -> float, list -> tuple); raises ConfigError."""
    origin = get_origin(hint)
    if origin is Literal:
        options = get_args(hint)
        require(value in options, f"{name}={value!r}: choose one of {', '.join(map(str, options))}")
        return value
    if origin in (types.UnionType, typing.Union):
        members = get_args(hint)
        if value is None and type(None) in members:
            return None
        errors = []
        for member in (m for m in members if m is not type(None)):
            try:
                return _convert(value, member, name)
            except ConfigError as exc:
                errors.append(str(exc).split(": ", 1)[-1])
        optional = " or unset" if type(None) in members else ""
        raise ConfigError(f"{name}={value!r}: {' or '.join(errors)}{optional}")
    if origin is tuple and get_args(hint)[1:] == (Ellipsis,):
        require(isinstance(value, tuple | list), f"{name}={value!r}: expected a list")
        assert isinstance(value, tuple | list)
        item = get_args(hint)[0]
        return tuple(_convert(v, item, f"{name}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        items = get_args(hint)
        ok = isinstance(value, tuple | list) and len(value) == len(items)
        require(ok, f"{name}={value!r}: expected a list of {len(items)} values")
        assert isinstance(value, tuple | list)
        return tuple(
            _convert(v, h, f"{name}[{i}]") for i, (v, h) in enumerate(zip(value, items, strict=True))
        )
    if hint is bool:
        require(isinstance(value, bool), f"{name}={value!r}: expected true or false")
        return value
    if hint is int:
        require(
            isinstance(value, int) and not isinstance(value, bool), f"{name}={value!r}: expected an integer"
        )
        return value
    if hint is float:
        require(_is_number(value), f"{name}={value!r}: expected a number")
        assert isinstance(value, int | float)
        return float(value)
    if hint is str:
        require(isinstance(value, str), f"{name}={value!r}: expected a string")
        return value
    if hint is Path:
        require(isinstance(value, str | Path), f"{name}={value!r}: expected a path")
        return Path(value)  # type: ignore[arg-type]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        require(isinstance(value, hint), f"{name}: expected a [{name}] table")
        return value
    raise TypeError(f"{name}: no check for the annotation {hint!r}")


def check_value(value: object, hint: Any, name: str) -> object:
    """`value` checked against the annotation `hint` and normalised as a field's would be; raises
    `ConfigError` naming `name` (for values checked before any config is built: the environment)."""
    return _convert(value, hint, name)


def check_fields(obj: Any, section: str) -> None:
    """Check (and normalise, on the frozen instance) every field of dataclass `obj` against its
    annotation; `section` prefixes field names in messages ('' for top-level fields)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        name = f"{section}.{f.name}" if section else f.name
        value = getattr(obj, f.name)
        converted = _convert(value, hints[f.name], name)
        if converted is not value:
            object.__setattr__(obj, f.name, converted)
