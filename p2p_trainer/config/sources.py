"""Where each value of a run config comes from: flag > environment > file > default.

The file is `--config` (or P2PT_CONFIG; without either, the packaged default run, which counts as
"default"). Environment variables name one field each: `P2PT_<FIELD>` for the top-level fields
(P2PT_SEED, P2PT_ROUNDS) and `P2PT_<TABLE>__<FIELD>` (two underscores) for a table's field
(P2PT_OUTER__METHOD, P2PT_DATA__BATCH_SIZE), in any case. A string field takes the value as
written; any other field takes a TOML value (16, 0.5, true, [0.9, 0.95]). A `P2PT_X__Y` name whose
table or field does not exist is an error, since a typo would otherwise be ignored without a
word; other `P2PT_` names without `__` are not config fields and are left alone. An empty variable
counts as unset (`VAR=` in a compose file or an environment file).

A file is read over the packaged default run (`over_default_run`): what it leaves unset comes
from the default run, then from each field's own default.

Values go into the file's tables before the config is built, so an environment variable or a
flag is the same as writing the value in the file: setting [outer] method keeps the file's other
[outer] values and the method's reference values fill only what is left unset.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import tomllib

from p2p_trainer.config.checks import ConfigError, check_value
from p2p_trainer.config.run import BY_METHOD, METHOD_DEFAULTS, RunConfig
from p2p_trainer.config.toml_io import (
    SECTIONS,
    TOP,
    config_from_dict,
    default_config_text,
    read_toml,
    toml_value,
)

ENV_PREFIX = "P2PT_"
CONFIG_FILE_ENV = "P2PT_CONFIG"
"""Names the config file where `--config` is not given (click reads it; not a field)."""

Key = tuple[str, str]
"""(table, field); the table is "" for the top-level fields."""


def dotted(key: Key) -> str:
    """A field's name as messages write it: "data.batch_size", "rounds"."""
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


def env_var(key: Key) -> str:
    """The environment variable that sets field `key`."""
    return ENV_PREFIX + (f"{key[0]}__{key[1]}" if key[0] else key[1]).upper()


@dataclass(frozen=True)
class Source:
    """Where one value came from: `kind` and, for a file, a variable or a flag, which one."""

    kind: Literal["default", "file", "env", "flag"]
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}" if self.detail else self.kind


@dataclass(frozen=True)
class EffectiveConfig:
    """The config a command runs, and the source of each of its fields ("data.batch_size": ...)."""

    config: RunConfig
    sources: dict[str, Source]


def field_hints() -> dict[Key, Any]:
    """Every config field's annotation, top-level fields first, tables in `SECTIONS` order."""
    top = typing.get_type_hints(RunConfig)
    hints: dict[Key, Any] = {("", name): top[name] for name in TOP}
    for table, cls in SECTIONS.items():
        for name, hint in typing.get_type_hints(cls).items():
            hints[(table, name)] = hint
    return hints


def _is_text(hint: Any) -> bool:
    """Whether values of `hint` are strings, which an environment variable holds as written."""
    if hint in (str, Path):
        return True
    if get_origin(hint) is Literal:
        return all(isinstance(option, str) for option in get_args(hint))
    if get_origin(hint) in (types.UnionType, typing.Union):
        members = [m for m in get_args(hint) if m is not type(None)]
        return all(_is_text(m) for m in members)
    return False


def _default_of(key: Key) -> object:
    table, name = key
    cls = SECTIONS[table] if table else RunConfig
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = f.default if f.default is not dataclasses.MISSING else None
    return METHOD_DEFAULTS["factored"][name] if default is BY_METHOD else default


def _env_key(name: str, hints: Mapping[Key, Any]) -> Key | None:
    """The field environment variable `name` sets; None for names that are not config fields."""
    rest = name[len(ENV_PREFIX) :].lower()
    if "__" not in rest:
        return ("", rest) if ("", rest) in hints else None
    table, _, field = rest.partition("__")
    if table not in SECTIONS:
        raise ConfigError(
            f"environment variable {name}: there is no table [{table}]; the tables are "
            f"{', '.join(SECTIONS)} (P2PT_<TABLE>__<FIELD>, e.g. P2PT_OUTER__METHOD): rename or unset it"
        )
    if (table, field) not in hints:
        fields = ", ".join(f for t, f in hints if t == table)
        raise ConfigError(
            f"environment variable {name}: [{table}] has no field {field!r}; its fields are {fields}: "
            f"rename or unset it"
        )
    return (table, field)


def _env_value(name: str, text: str, key: Key, hint: Any) -> object:
    if _is_text(hint):
        value: object = text
    else:
        try:
            parsed = tomllib.loads(f"value = {text}")
            value = parsed["value"] if list(parsed) == ["value"] else text
        except tomllib.TOMLDecodeError:
            value = text  # not a TOML value: the type check below says what the field takes
    try:
        return check_value(value, hint, dotted(key))
    except ConfigError as exc:
        what = str(exc).split(": ", 1)[-1]
        default = _default_of(key)
        example = "" if default is None else f", e.g. {name}={_env_text(default, hint)}"
        raise ConfigError(
            f"environment variable {name}={text!r} is not a valid {dotted(key)} ({what}); "
            f"change it{example}, or unset it"
        ) from None


def _env_text(value: object, hint: Any) -> str:
    """`value` written as an environment variable holds it."""
    return str(value) if _is_text(hint) else toml_value(value)


def read_environment(environ: Mapping[str, str]) -> dict[Key, tuple[object, str]]:
    """The config fields set in `environ`: {key: (checked value, variable name)}. A variable with
    a wrong type or an unknown field raises `ConfigError` naming the variable and its value."""
    hints = field_hints()
    found: dict[Key, tuple[object, str]] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_FILE_ENV or environ[name] == "":
            continue  # an empty variable counts as unset, as for click's P2PT_CONFIG
        key = _env_key(name, hints)
        if key is not None:
            found[key] = (_env_value(name, environ[name], key, hints[key]), name)
    return found


def _put(raw: dict[str, Any], key: Key, value: object) -> None:
    table, name = key
    if not table:
        raw[name] = value
        return
    section = raw.setdefault(table, {})
    if isinstance(section, dict):  # not a table: config_from_dict names that error
        section[name] = list(value) if isinstance(value, tuple) else value


def _keys_in(raw: Mapping[str, Any]) -> list[Key]:
    keys: list[Key] = [("", name) for name in raw if name in TOP]
    for table in SECTIONS:
        section = raw.get(table)
        if isinstance(section, dict):
            keys += [(table, name) for name in section]
    return keys


def _origin_note(message: str, overridden: Mapping[Key, Source]) -> str:
    """Where the values a `ConfigError` names came from, when not from the file."""
    notes = [
        f"{dotted(key)} is set by {'environment variable' if src.kind == 'env' else 'flag'} {src.detail}"
        for key, src in overridden.items()
        if re.search(rf"(?<![\w.]){re.escape(dotted(key))}(?!\w)", message)
    ]
    return f" ({'; '.join(notes)}: change or unset it)" if notes else ""


def over_default_run(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[Key]]:
    """A config file's tables laid over the packaged default run's, and the keys only the default set.

    A file says how its run differs from the default run (`p2p-trainer config` prints it), so one
    that names only its model and data still gets the default run's method, H, codecs and quorum,
    not the fields' bare defaults (float32 on the wire, a quorum of half the group): the same run
    as the default one with `--method` and the environment saying what differs.
    """
    default = tomllib.loads(default_config_text())
    merged = dict(default)
    for name, value in raw.items():
        base = merged.get(name)
        merged[name] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    in_file = set(_keys_in(raw))
    return merged, [key for key in _keys_in(default) if key not in in_file]


def effective_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    method: str | None = None,
    rounds: int | None = None,
    seed: int | None = None,
    tensorboard_dir: str | None = None,
) -> EffectiveConfig:
    """The run in TOML file `path` (None: the packaged default run), the config fields set in
    `environ` on top (None: none) and the flags on top of those; with the source of each field."""
    in_file = {} if path is None else read_toml(path)
    raw, from_default = over_default_run(in_file)
    sources = {dotted(key): Source("file", str(path)) for key in _keys_in(in_file)}
    sources.update({dotted(key): Source("default", "(default.toml)") for key in from_default})
    overridden: dict[Key, Source] = {}
    env = read_environment(environ) if environ is not None else {}
    flags: dict[Key, tuple[object, str]] = {
        ("outer", "method"): (method, "--method"),
        ("", "rounds"): (rounds, "--rounds"),
        ("", "seed"): (seed, "--seed"),
        ("log", "tensorboard_dir"): (tensorboard_dir, "--tensorboard-dir"),
    }
    for key, (value, name) in env.items():
        _put(raw, key, value)
        overridden[key] = Source("env", name)
    for key, (value, name) in flags.items():
        if value is not None:
            _put(raw, key, value)
            overridden[key] = Source("flag", name)
    sources.update({dotted(key): src for key, src in overridden.items()})
    try:
        cfg = config_from_dict(raw, where="default config" if path is None else str(path))
    except ConfigError as exc:
        raise ConfigError(f"{exc}{_origin_note(str(exc), overridden)}") from None
    for key in field_hints():
        if dotted(key) not in sources:
            by_method = key[0] == "outer" and key[1] in METHOD_DEFAULTS[cfg.outer.method]
            sources[dotted(key)] = Source("default", _method_note(cfg, key[1]) if by_method else "")
    return EffectiveConfig(cfg, sources)


def _method_note(cfg: RunConfig, name: str) -> str:
    """Why a method's default applies; DiLoCo aligns its rounds only when it overlaps one fragment."""
    outer = cfg.outer
    if outer.method == "diloco" and name == "align_rounds":
        how = "overlapped, one fragment" if outer.overlaps_whole_model else "not overlapped"
        return f"(method diloco, {how})"
    return f"(method {outer.method})"


def load_config(
    path: str | Path | None = None,
    *,
    method: str | None = None,
    rounds: int | None = None,
    seed: int | None = None,
) -> RunConfig:
    """The run in TOML file `path` (None: the packaged default run), with the flags on top and no
    environment (the command line adds it: `effective_config`).

    The overrides go into the file's tables before the config is built, so `method` changes only
    [outer] method: the file's other [outer] values stay, and the method's reference values fill
    only the fields the file leaves unset (the same as writing `method = ...` in the file).
    """
    return effective_config(path, method=method, rounds=rounds, seed=seed).config
