"""The lines of a peer's metrics.jsonl as typed, versioned records: one schema, written and read here.

Every line is one record with a `kind` (start, resume, round, rejoin, final) and the `schema`
version it was written with. `p2p-trainer join` and the hivemind baseline write them; `local`,
the chaos lab, the benches and the tests read them with `read_log`, never as loose dicts. A line
of a newer schema, of an unknown kind or with a field of the wrong type is refused with an error
naming the line and the field. Lines written before records were versioned (no `schema`) are read
as schema 0: their extra fields are dropped and their nulls take the field's default.

This module uses only the standard library, so every layer (the methods included) can use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, Union, get_args, get_origin, get_type_hints

SCHEMA = 4
"""The schema version every line is written with; bump it whenever a field changes."""
LEGACY = 0
"""The version of lines that carry no `schema` field (written before records were versioned)."""
EXCHANGE_OUTCOMES = ("ok", "partial", "alone", "failed")
"""How an exchange ended (`run/round_lines.exchange_outcome`), from best to worst; heartbeats carry
one of these too (`net/records.py`), so the words live here, where every layer can read them."""


class RoundLogError(ValueError):
    """A metrics line that is not a valid record of a known kind and schema."""


@dataclass(frozen=True)
class _Record:
    """Serialisation shared by the records: fields to JSON values and back, with type checks."""

    _ROUNDED: ClassVar[frozenset[str]] = frozenset()
    """Float fields written to 4 decimals (seconds): the lines stay short, the records keep full
    precision in memory."""

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: _to_json_value(getattr(self, f.name), f.name in self._ROUNDED)
            for f in _fields(type(self))
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], schema: int = SCHEMA) -> Self:
        """Parse and check `data`; `RoundLogError` names the first field that is missing or mistyped."""
        return cls._parse(data, schema, cls.__name__)

    @classmethod
    def _parse(cls, data: object, schema: int, where: str) -> Self:
        if not isinstance(data, Mapping):
            raise RoundLogError(f"{where}: expected an object, got {_describe(data)}")
        specs = _specs(cls)
        if schema != LEGACY:
            unknown = sorted(set(data) - specs.keys() - _ENVELOPE)
            if unknown:
                raise RoundLogError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
        values: dict[str, Any] = {}
        for name, (required, convert) in specs.items():
            value = data.get(name)
            if name not in data or (value is None and schema == LEGACY and not required):
                if required:
                    raise RoundLogError(f"{where}.{name}: missing")
                continue
            values[name] = convert(f"{where}.{name}", value, schema)
        return cls(**values)


_ENVELOPE = frozenset({"kind", "schema"})
Convert = Callable[[str, object, int], object]
"""Checks one JSON value against a field's type and returns the field's value (`where` names it)."""
_SPECS: dict[type, dict[str, tuple[bool, Convert]]] = {}


def _fields(cls: type[_Record]) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


def _specs(cls: type[_Record]) -> dict[str, tuple[bool, Convert]]:
    """Per field of `cls`: is it required, and its converter (built once: field types are resolved
    from their annotations, which is too slow to do on every line)."""
    if cls not in _SPECS:
        hints = get_type_hints(cls)
        _SPECS[cls] = {
            f.name: (
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                _converter(hints[f.name]),
            )
            for f in _fields(cls)
        }
    return _SPECS[cls]


def _to_json_value(value: object, rounded: bool) -> object:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_json_value(v, rounded) for v in value]
    if rounded and isinstance(value, float):
        return round(value, 4)
    return value


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _converter(tp: Any) -> Convert:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if len(args) != 2 or type(None) not in args:
            raise TypeError(f"unsupported field type {tp}")
        inner = _converter(next(a for a in args if a is not type(None)))
        return lambda where, v, schema: None if v is None else inner(where, v, schema)
    if origin is tuple:
        item = _converter(get_args(tp)[0])

        def items(where: str, v: object, schema: int) -> object:
            if not isinstance(v, list):
                raise RoundLogError(f"{where}: expected a list, got {_describe(v)}")
            return tuple(item(f"{where}[{i}]", x, schema) for i, x in enumerate(v))

        return items
    if isinstance(tp, type) and issubclass(tp, _Record):
        record: type[_Record] = tp
        return lambda where, v, schema: record._parse(v, schema, where)
    if tp not in (float, int, str, bool):
        raise TypeError(f"unsupported field type {tp}")
    # JSON keeps bools and ints apart (Python does not), and writes a whole float as an int only
    # if a writer handed it an int: a float field takes either
    accepted = (int, float) if tp is float else (tp,)

    def scalar(where: str, v: object, schema: int) -> object:
        if type(v) not in accepted:
            raise RoundLogError(f"{where}: expected {tp.__name__}, got {_describe(v)}")
        return tp(v)

    return scalar


@dataclass(frozen=True)
class ExchangeRecord(_Record):
    """What one exchange did for this peer: its outcome, its group, its time and bytes."""

    tag: str
    """Which exchange of the method ("outer", "noloco", "mix1", "mix2", "grad", "hivemind")."""
    ok: bool
    group_size: int
    """Peers whose values reached the result (1: none but this one; 0: all, where not counted)."""
    elapsed_s: float
    blocked_s: float
    """Time the peer's training waited for it (a background exchange waits only at its end)."""
    bytes_sent: int = 0
    bytes_received: int = 0
    reason: str = ""
    """Why it failed ("" if it did not)."""
    left_out: tuple[str, ...] = ()
    """Members (short ids) left out of some part: late, dead or dropped."""
    own_parts: int = 0
    """Parts where this peer kept its own values."""
    late_parts: int = 0
    """Parts whose owner averaged without this peer's values (it was behind its group)."""
    started_unix: float = 0.0
    """Wall-clock start (time.time())."""
    group: str = ""
    """The exchange's group key: members' records of one exchange share it (benches line them up)."""

    _ROUNDED: ClassVar[frozenset[str]] = frozenset({"elapsed_s", "blocked_s", "started_unix"})

    @property
    def merged(self) -> bool:
        """Did another peer's values reach this peer's result? A partial result (some parts kept
        as own values, so group_size 1) did merge; a group of one or a failure did not."""
        return self.ok and (self.group_size >= 2 or self.own_parts > 0)


@dataclass(frozen=True)
class DropCount(_Record):
    """DHT records a peer refused during one round, for one reason (`net/envelope.py` REASONS)."""

    source: str
    """`read`: dropped by this process when it read them (the swarm view); `stored`: by its DHT
    node's validator, when others stored them there or returned them."""
    reason: str
    """Why: `not-admitted`, `bad-signature`, `implausible`, `replay`, ..."""
    count: int


@dataclass(frozen=True)
class _Line(_Record):
    """A whole metrics line: a record plus its `kind` and `schema`."""

    KIND: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, "schema": SCHEMA, **super().to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


@dataclass(frozen=True)
class StartRecord(_Line):
    """A peer process started (each life of a restarted peer opens with one)."""

    KIND: ClassVar[str] = "start"
    peer: str
    unix_time: float
    run_id: str = ""
    """The run definition's digest ("" for the hivemind baseline)."""
    method: str = ""
    """The outer method ("hivemind" for the baseline bench; "" in lines written before it was recorded)."""


@dataclass(frozen=True)
class ResumeRecord(_Line):
    """The peer resumed from its own checkpoint."""

    KIND: ClassVar[str] = "resume"
    round: int
    state_hash: str


@dataclass(frozen=True)
class RoundRecord(_Line):
    """One completed outer round, with the exchanges it made."""

    KIND: ClassVar[str] = "round"
    peer: str
    time_s: float
    """Seconds since the peer process started (monotonic)."""
    unix_time: float
    """When the round ended (time.time())."""
    round: int
    step: int
    """Inner steps done after this round."""
    tokens: int
    """Tokens this peer processed so far."""
    train_loss: float
    val_loss: float | None
    compute_s: float
    """Time in inner steps (blocking exchange time excluded)."""
    blocked_s: float
    wall_s: float
    round_tokens: int = 0
    """Tokens of this round (a constant-work round tops up when peers left)."""
    live_peers: int = 0
    """Training peers this one counted when it sized its share (0 where not counted)."""
    skipped_steps: int = 0
    """Inner steps of the round this peer did not run in it: left out because it adopted a state
    mid-round or aligned its round start with the swarm's, or done before a mid-round stop (and
    not redone when the round resumed)."""
    landed_at_step: int | None = None
    """Inner steps of this round done when the exchange running behind it was applied
    (`outer.land_at_step`; from schema 4); None: it was applied at the round's end, or none ran
    (or it landed in the part of a round run before a mid-round stop)."""
    bytes_sent: int = 0
    bytes_received: int = 0
    exchanges: tuple[ExchangeRecord, ...] = ()
    dropped: tuple[DropCount, ...] = ()
    """Records refused during the round, by source and reason (only those with a count; from
    schema 3, empty before)."""


@dataclass(frozen=True)
class RejoinRecord(_Line):
    """The peer fell behind and adopted the swarm's state."""

    KIND: ClassVar[str] = "rejoin"
    from_round: int
    to_round: int
    catch_up_steps: int


@dataclass(frozen=True)
class FinalRecord(_Line):
    """The peer finished (its round bound, its time limit, or a stop signal)."""

    KIND: ClassVar[str] = "final"
    peer: str
    round: int
    tokens: int
    val_loss: float | None
    """Validation loss of the final anchor."""
    time_s: float
    stopped: bool
    """True if a signal stopped it before its round bound."""
    state_hash: str = ""
    """Digest of the final checkpoint ("" where none was written)."""
    step: int = 0
    own_val_loss: float | None = None
    """Validation loss of the peer's own anchor before the final agreement (None where none ran)."""
    agreement: ExchangeRecord | None = None
    """The final agreement's exchange (None where none ran: a stop signal, method independent)."""
    kept_own: bool = False
    """The agreement merged, but its average was worse than the peer's own model by more than
    `exchange.final_max_loss_increase`, so the peer kept its own."""


LogRecord = StartRecord | ResumeRecord | RoundRecord | RejoinRecord | FinalRecord
KINDS: dict[str, type[LogRecord]] = {
    c.KIND: c for c in (StartRecord, ResumeRecord, RoundRecord, RejoinRecord, FinalRecord)
}


def parse_record(data: object) -> LogRecord:
    """One decoded metrics line as its record; `RoundLogError` if it is none of a known kind/schema."""
    if not isinstance(data, dict):
        raise RoundLogError(f"expected an object, got {_describe(data)}")
    kind, schema = data.get("kind"), data.get("schema", LEGACY)
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise RoundLogError(f"field 'schema' must be an int, got {_describe(schema)}")
    if schema > SCHEMA:
        raise RoundLogError(f"schema {schema} is newer than this reader's ({SCHEMA}): upgrade p2p-trainer")
    if kind not in KINDS:
        raise RoundLogError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    return KINDS[kind].from_dict(data, schema)


@dataclass(frozen=True)
class RunLog:
    """A metrics file's records in file order, with the views the readers need."""

    records: tuple[LogRecord, ...] = ()
    torn: int = 0
    """Lines that were not whole JSON (a writer killed mid-line); they are skipped."""

    @property
    def starts(self) -> list[StartRecord]:
        return [r for r in self.records if isinstance(r, StartRecord)]

    @property
    def rounds(self) -> list[RoundRecord]:
        return [r for r in self.records if isinstance(r, RoundRecord)]

    @property
    def finals(self) -> list[FinalRecord]:
        return [r for r in self.records if isinstance(r, FinalRecord)]

    @property
    def resumes(self) -> list[ResumeRecord]:
        return [r for r in self.records if isinstance(r, ResumeRecord)]

    @property
    def rejoins(self) -> list[RejoinRecord]:
        return [r for r in self.records if isinstance(r, RejoinRecord)]

    @property
    def final(self) -> FinalRecord | None:
        """The last life's final record, if it wrote one."""
        finals = self.finals
        return finals[-1] if finals else None

    def lives(self) -> list[RunLog]:
        """The records of each life: a start record opens one (records before any start form one too)."""
        lives: list[list[LogRecord]] = []
        for r in self.records:
            if isinstance(r, StartRecord) or not lives:
                lives.append([])
            lives[-1].append(r)
        return [RunLog(tuple(life)) for life in lives]


def parse_lines(lines: Sequence[str], source: str = "metrics") -> RunLog:
    """Records of metrics lines. A line that is not whole JSON was torn by a writer killed mid-line
    (a restarted writer then appends to it) and is skipped; a whole line that is no valid record
    raises `RoundLogError` naming `source` and the line number."""
    out: list[LogRecord] = []
    torn = 0
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        try:
            out.append(parse_record(data))
        except RoundLogError as e:
            raise RoundLogError(f"{source}:{n}: {e}") from None
    return RunLog(tuple(out), torn)


def read_log(path: Path) -> RunLog:
    """All complete records of a metrics file (an empty log if it does not exist yet)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return RunLog()
    return parse_lines(text.splitlines(), str(path))


class LogTail:
    """Follows a metrics file that its writer keeps appending to: each `read()` parses only the
    whole lines added since the last one. Pollers (the chaos runner and injector read the peers'
    files many times a second) would otherwise parse a long run's whole file each time and take
    CPU from the peers they watch. A file that was replaced or truncated is read again from its
    start; a line still being written is left for the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._inode, self._offset, self._log = -1, 0, RunLog()

    def read(self) -> RunLog:
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self._inode or st.st_size < self._offset:
                    self._inode, self._offset, self._log = st.st_ino, 0, RunLog()
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self._log
        end = chunk.rfind(b"\n") + 1
        if end:
            new = parse_lines(chunk[:end].decode("utf-8", "replace").splitlines(), str(self.path))
            self._log = RunLog(self._log.records + new.records, self._log.torn + new.torn)
            self._offset += end
        return self._log
