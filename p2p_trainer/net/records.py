"""Typed, expiring DHT records. Values are msgpack bytes that we encode and validate ourselves.

Nothing read from the DHT is unpickled: every value is `msgpack.unpackb`ed into plain types, and
each field is checked for type and range before it becomes a record; malformed records are dropped
with a log line. Keys are scoped by run name:

- `p2p-trainer/<run>/peers`, subkey = peer id: a `Heartbeat`, expiring after a few heartbeat periods;
- `p2p-trainer/<run>/definition`, subkey = publisher's peer id: the `RunDefinition` it trains;
- `p2p-trainer/identity/<peer id>`: a `Liveness` record, used to refuse a second node with a live key.
- `p2p-trainer/<run>/revocations`, subkey = publisher's peer id: the owners' revocations it
  holds (`revocation.py`).

Every value is a signed envelope (`envelope.py`) sealed by the peer the key names, so a peer can
write only its own heartbeat, definition and liveness record. Readers check the signature and
that binding (`verify=True`, the default); with the security defences off they only decode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import msgpack
from hivemind.utils.timed_storage import get_dht_time

from p2p_trainer.net.direct import check_address
from p2p_trainer.net.envelope import READ_DROPS, EnvelopeError, Signer, open_envelope, open_verified
from p2p_trainer.net.identity import B58_ALPHABET
from p2p_trainer.round_log import EXCHANGE_OUTCOMES

logger = logging.getLogger(__name__)

KEY_PREFIX = "p2p-trainer"
MAX_RECORD_BYTES = 4096
MAX_CLOCK_SKEW_S = 600.0
"""Heartbeats stamped further ahead of our clock than this are dropped."""
_MAX_STR = 128


class RecordError(ValueError):
    """A record that fails validation; `reason` names the drop counter (`envelope.REASONS`)."""

    def __init__(self, message: str, reason: str = "body") -> None:
        super().__init__(message)
        self.reason = reason


class RunDefinitionMismatch(RuntimeError):
    """This peer's run definition differs from the swarm's; the message lists the differing fields."""


class DHTLike(Protocol):
    """The part of `hivemind.DHT` these functions use (a fake implements it in unit tests)."""

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> Any: ...

    def get(self, key: Any, latest: bool = False) -> Any: ...


def now() -> float:
    """DHT time (seconds), the clock that record expirations are measured in."""
    return float(get_dht_time())


def seal_and_store(
    dht: DHTLike, signer: Signer, key: str, subkey: str | None, body: bytes, expiration_time: float
) -> bool:
    """Store `body` signed by `signer` (the owner of `key`/`subkey`) until `expiration_time`."""
    sealed = signer.seal(key, subkey, expiration_time, body)
    return bool(dht.store(key, sealed, expiration_time, subkey=subkey))


def open_body(entry: object, key: str, subkey: str | None, verify: bool) -> bytes:
    """The body of a value read back from the DHT (`entry` has `.value` and `.expiration_time`).

    Raises `RecordError` for anything but a well-formed envelope; with `verify`, also unless its
    owner signed it for this key, subkey and expiry. Drops are counted in `READ_DROPS`.
    """
    data, expiration = getattr(entry, "value", None), getattr(entry, "expiration_time", None)
    try:
        if not verify:
            return open_envelope(data).body
        if not isinstance(expiration, int | float):
            raise EnvelopeError("malformed", "no expiration time")
        return open_verified(data, key, subkey, float(expiration)).body
    except EnvelopeError as e:
        raise RecordError(str(e), e.reason) from None


def pack(fields: dict[str, object]) -> bytes:
    return bytes(msgpack.packb(fields, use_bin_type=True))


def unpack(data: object) -> dict[str, object]:
    """msgpack bytes -> a dict with str keys; anything else raises `RecordError`. Never unpickles."""
    if not isinstance(data, bytes) or len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"expected at most {MAX_RECORD_BYTES} msgpack bytes, got {type(data).__name__}")
    try:
        fields = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for malformed input
        raise RecordError(f"not valid msgpack: {e}") from None
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise RecordError(f"expected a map with string keys, got {type(fields).__name__}")
    return fields


def _field(fields: dict[str, object], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in fields:
        raise RecordError(f"missing field {name!r}")
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RecordError(f"field {name!r} has type {type(value).__name__}")
    if isinstance(value, str) and not 0 < len(value) <= _MAX_STR:
        raise RecordError(f"field {name!r} has length {len(value)}")
    return value


def _non_negative(fields: dict[str, object], name: str, kind: type | tuple[type, ...]) -> Any:
    value = _field(fields, name, kind)
    if not math.isfinite(value) or value < 0:
        raise RecordError(f"field {name!r} = {value} is not a finite non-negative number")
    return value


# ------------------------------------------------------------------------------------------------ heartbeats


@dataclass(frozen=True)
class Heartbeat:
    """What a training peer tells the swarm about itself, every heartbeat period."""

    peer_id: str
    round: int
    tokens_processed: int
    loss: float | None
    """Latest training loss (nats/byte); None before the first step."""
    throughput_tokens_per_s: float
    software_version: str
    timestamp: float
    """DHT time when the record was made."""
    leaving: bool = False
    """A tombstone: the peer left cleanly; `list_live_peers` drops it before its TTL runs out."""
    round_started: float = 0.0
    """DHT time when the peer began round `round`; 0 when unknown (peers may line up on it)."""
    suspects: tuple[str, ...] = ()
    """Peers this one has just failed to reach (`health.py`): the others leave them out of their
    groups until they publish a newer heartbeat, so a death spreads in one heartbeat period."""
    invitation: str = ""
    """This peer's invitation to a swarm with `admission = "invitations"` (`admission.py`); "" otherwise."""
    # What `status` and the dashboard show; nothing in the swarm acts on them. Heartbeats of older
    # peers lack them and decode with these defaults (0, ""), which the tables show as unknown.
    step: int = 0
    """Inner steps the peer has done over the whole run."""
    round_step: int = 0
    """Inner steps done in the current round (`round_steps` once it is exchanging)."""
    round_steps: int = 0
    """Inner steps per round (`outer.num_inner_steps`); 0: not reported."""
    bytes_sent: int = 0
    """Bytes this peer process's exchanges sent so far."""
    bytes_received: int = 0
    """Bytes its exchanges received so far."""
    reachability: str = ""
    """What its start-up dial-back check found (`REACHABILITY`); "": not reported."""
    last_exchange: str = ""
    """The worst outcome of its last round's exchanges (`EXCHANGE_OUTCOMES`); "": none yet."""
    data_address: str = ""
    """Where its direct data plane listens (`direct.py`: an IP and a port); "": use p2pd."""
    enters_round: int = 0
    """The first round whose groups may count this peer (`entry.py`): a late joiner names a round
    far enough ahead for every view to have read this record by then; 0 for the others."""
    leaves_round: int = 0
    """The first round whose groups leave this peer out (`entry.py`): a peer whose time bound is
    near names a round far enough ahead for every view to have read this record by then; 0 for
    the others."""
    excludes: tuple[tuple[str, int, int], ...] = ()
    """Peers this one votes out of the swarm's groups (`exclusion.py`), each with the first round
    the vote covers and the first it no longer does; named ahead, as an entry round is."""

    def encode(self) -> bytes:
        fields = asdict(self)
        for name in ("enters_round", "leaves_round", "excludes"):
            if not fields[name]:
                del fields[name]
        if not self.invitation:  # most swarms are open: their heartbeats carry no invitation field
            del fields["invitation"]
        if not self.data_address:
            del fields["data_address"]
        for name in PROGRESS_FIELDS:  # every peer reads every heartbeat each period: no zeros sent
            if not fields[name]:
                del fields[name]
        return pack(fields)

    @staticmethod
    def decode(data: object) -> Heartbeat:
        fields = unpack(data)
        loss = fields.get("loss")
        if loss is not None:
            loss = float(_non_negative(fields, "loss", (int, float)))
        leaving = fields.get("leaving", False)
        if not isinstance(leaving, bool):
            raise RecordError(f"field 'leaving' has type {type(leaving).__name__}")
        beat = Heartbeat(
            peer_id=_field(fields, "peer_id", str),
            round=_non_negative(fields, "round", int),
            tokens_processed=_non_negative(fields, "tokens_processed", int),
            loss=loss,
            throughput_tokens_per_s=float(_non_negative(fields, "throughput_tokens_per_s", (int, float))),
            software_version=_field(fields, "software_version", str),
            timestamp=float(_non_negative(fields, "timestamp", (int, float))),
            leaving=leaving,
            round_started=float(_non_negative(fields, "round_started", (int, float)))
            if "round_started" in fields
            else 0.0,
            suspects=_suspects(fields.get("suspects", [])),
            invitation=_invitation(fields.get("invitation", "")),
            step=_count(fields, "step", MAX_STEPS),
            round_step=_count(fields, "round_step", MAX_ROUND_STEPS),
            round_steps=_count(fields, "round_steps", MAX_ROUND_STEPS),
            bytes_sent=_count(fields, "bytes_sent", MAX_BYTES),
            bytes_received=_count(fields, "bytes_received", MAX_BYTES),
            reachability=_word(fields, "reachability", ("", *REACHABILITY)),
            last_exchange=_word(fields, "last_exchange", ("", *EXCHANGE_OUTCOMES)),
            data_address=_data_address(fields.get("data_address", "")),
            enters_round=_count(fields, "enters_round", MAX_STEPS),
            leaves_round=_count(fields, "leaves_round", MAX_STEPS),
            excludes=_excludes(fields.get("excludes", [])),
        )
        if beat.round_steps and beat.round_step > beat.round_steps:
            raise RecordError(
                f"field 'round_step' = {beat.round_step} exceeds round_steps = {beat.round_steps}"
            )
        return beat


PROGRESS_FIELDS = (
    "step",
    "round_step",
    "round_steps",
    "bytes_sent",
    "bytes_received",
    "reachability",
    "last_exchange",
)
"""Heartbeat fields only shown (`status`, the dashboard); left out of a record where 0 or ""."""
REACHABILITY = ("reachable", "behind-nat", "unreachable", "unchecked")
"""What a peer's dial-back check at start found (`reach.Reachability.verdict`): dialled; not
dialled and seen from an address not its own; not dialled otherwise; no checker answered."""
MAX_STEPS = 1 << 40
"""Bounds of the counters a heartbeat reports: far above any real run (2^40 inner steps, 2^20
steps per round, 2^60 bytes), low enough that a table never prints a forged 2^64."""
MAX_ROUND_STEPS = 1 << 20
MAX_BYTES = 1 << 60


def _count(fields: dict[str, object], name: str, bound: int) -> int:
    """An optional non-negative int field below `bound` (0 where absent: an older peer's heartbeat)."""
    value = fields.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
        raise RecordError(f"field {name!r} = {value!r} is not an int in [0, {bound})")
    return value


def _data_address(value: object) -> str:
    if value == "":
        return ""
    if not isinstance(value, str):
        raise RecordError(f"field 'data_address' has type {type(value).__name__}")
    try:
        check_address(value)
    except ValueError as exc:
        raise RecordError(f"field 'data_address': {exc}") from None
    return value


MAX_WORD_CHARS = 32
"""A display-only word longer than this is malformed, not a word of a newer version."""
_unknown_words: set[tuple[str, str]] = set()
"""(field, word) pairs already logged; bounded by `MAX_LOGGED_WORDS`."""
MAX_LOGGED_WORDS = 64


def _word(fields: dict[str, object], name: str, vocabulary: tuple[str, ...]) -> str:
    """An optional display-only field holding one word of `vocabulary` ("" where absent).

    A short word this version does not know reads as "" (not reported) instead of refusing the
    heartbeat: a newer peer may report a word added later (say a new reachability), and during a
    rolling upgrade it must not look dead to this one for a field only `status` shows."""
    value = fields.get(name, "")
    if not isinstance(value, str) or len(value) > MAX_WORD_CHARS:
        shown = repr(value)[:40]  # a forged value may be long: the log line stays short
        raise RecordError(f"field {name!r} = {shown} is none of {', '.join(map(repr, vocabulary))}")
    if value not in vocabulary:
        if (name, value) not in _unknown_words and len(_unknown_words) < MAX_LOGGED_WORDS:
            _unknown_words.add((name, value))
            logger.info(
                "a heartbeat's %s %r is not a word this version knows: shown as not reported", name, value
            )
        return ""
    return value


def _is_peer_id(value: object) -> bool:
    """A base58 peer id of bounded length (what `suspects` and `excludes` name)."""
    return isinstance(value, str) and 0 < len(value) <= _MAX_STR and set(value) <= set(B58_ALPHABET)


MAX_SUSPECTS = 32
"""Suspects one heartbeat may name; more would not fit `MAX_RECORD_BYTES` with room to spare."""


def _suspects(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_SUSPECTS:
        raise RecordError(f"field 'suspects' must be a list of at most {MAX_SUSPECTS} peer ids")
    for peer in value:
        if not _is_peer_id(peer):
            raise RecordError(f"field 'suspects' holds {peer!r}, not a base58 peer id")
    return tuple(value)


MAX_EXCLUDES = 8
"""Votes one heartbeat may carry (`exclusion.py`); with `MAX_SUSPECTS` suspects they still fit
`MAX_RECORD_BYTES`."""


def _excludes(value: object) -> tuple[tuple[str, int, int], ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_EXCLUDES:
        raise RecordError(f"field 'excludes' must be a list of at most {MAX_EXCLUDES} votes")
    votes = []
    for vote in value:
        if not isinstance(vote, list | tuple) or len(vote) != 3:
            raise RecordError(f"field 'excludes' holds {vote!r}, not [peer id, first round, end round]")
        peer, first, end = vote
        if not _is_peer_id(peer):
            raise RecordError(f"field 'excludes' names {peer!r}, not a base58 peer id")
        # bool is an int: a vote's rounds must be plain ints
        if not all(type(r) is int for r in (first, end)) or not 0 <= first < end < MAX_STEPS:
            raise RecordError(f"field 'excludes' has rounds {first!r}..{end!r}: need 0 <= first < end < 2^40")
        votes.append((peer, first, end))
    return tuple(votes)


MAX_INVITATION_CHARS = 512
"""Longest invitation a heartbeat may carry (`admission.py`; a real one is about 260 characters)."""


def _invitation(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_INVITATION_CHARS:
        raise RecordError(f"field 'invitation' must be text of at most {MAX_INVITATION_CHARS} characters")
    return value


def _check_heartbeat(heartbeat: Heartbeat) -> Heartbeat:
    if not set(heartbeat.peer_id) <= set(B58_ALPHABET):
        raise RecordError(f"peer id {heartbeat.peer_id!r} is not base58")
    if heartbeat.timestamp > now() + MAX_CLOCK_SKEW_S:
        raise RecordError(f"timestamp {heartbeat.timestamp:.0f} is more than {MAX_CLOCK_SKEW_S:.0f} s ahead")
    return heartbeat


def heartbeat_key(run_name: str) -> str:
    return f"{KEY_PREFIX}/{run_name}/peers"


def publish_heartbeat(
    dht: DHTLike, run_name: str, heartbeat: Heartbeat, ttl_s: float, signer: Signer
) -> bool:
    """Store `heartbeat`, signed, under the run's peers key (subkey = peer id), expiring `ttl_s` from now.

    Raises `RecordError` if the heartbeat would be dropped by the other peers (e.g. a NaN loss, or
    a peer id that is not the signer's).
    """
    _check_heartbeat(Heartbeat.decode(heartbeat.encode()))
    if heartbeat.peer_id != signer.peer_id:
        raise RecordError(f"heartbeat of {heartbeat.peer_id} cannot be signed by {signer.peer_id}")
    body = heartbeat.encode()
    return seal_and_store(dht, signer, heartbeat_key(run_name), heartbeat.peer_id, body, now() + ttl_s)


def read_heartbeats(dht: DHTLike, run_name: str, verify: bool = True) -> list[tuple[Heartbeat, float]]:
    """Every well-formed heartbeat of the run (tombstones and expired ones too) with its expiration
    time, sorted by peer id; malformed or forged records are counted and dropped."""
    found = dht.get(heartbeat_key(run_name), latest=True)
    if found is None:
        return []
    entries = getattr(found, "value", None)
    if not isinstance(entries, dict):
        READ_DROPS.count("malformed", f"dropping peers record of run {run_name!r}: not a subkey map")
        return []
    heartbeats = []
    for subkey, entry in entries.items():
        try:
            if not isinstance(subkey, str):
                raise RecordError(f"subkey of type {type(subkey).__name__}")
            body = open_body(entry, heartbeat_key(run_name), subkey, verify)
            heartbeat = _check_heartbeat(Heartbeat.decode(body))
            if heartbeat.peer_id != subkey:
                raise RecordError(f"peer id {heartbeat.peer_id!r} differs from its subkey")
        except RecordError as e:
            READ_DROPS.count(e.reason, f"dropping malformed heartbeat under subkey {subkey!r}: {e}")
            continue
        heartbeats.append((heartbeat, float(getattr(entry, "expiration_time", 0.0))))
    return sorted(heartbeats, key=lambda item: item[0].peer_id)


def list_live_peers(
    dht: DHTLike, run_name: str, left: set[str] | None = None, verify: bool = True
) -> list[Heartbeat]:
    """Heartbeats of the run's live peers, sorted by peer id; malformed records are counted and dropped.

    Tombstones (`leaving`) are left out: a peer that left cleanly disappears at once. Their peer
    ids are added to `left` where one is given.
    """
    current = now()
    heartbeats = []
    for heartbeat, expiration in read_heartbeats(dht, run_name, verify):
        if heartbeat.leaving and left is not None:
            left.add(heartbeat.peer_id)
        if expiration >= current and not heartbeat.leaving:
            heartbeats.append(heartbeat)
    return heartbeats


# ------------------------------------------------------------------------------------------------ run definition


@dataclass(frozen=True)
class RunDefinition:
    """What peers of one run must agree on (model shape, method, data, seed), as JSON-like fields."""

    fields: dict[str, object]

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of the fields (sorted keys)."""
        canonical = json.dumps(self.fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def encode(self) -> bytes:
        return pack({"digest": self.digest, "fields": self.fields})

    @staticmethod
    def decode(data: object) -> RunDefinition:
        record = unpack(data)
        fields = _field(record, "fields", dict)
        if _depth(fields) > MAX_DEFINITION_DEPTH:
            raise RecordError(f"fields nest deeper than {MAX_DEFINITION_DEPTH} levels")
        definition = RunDefinition(fields=fields)
        try:
            digest = definition.digest
        except (TypeError, ValueError) as e:  # bytes or other non-JSON values from a peer
            raise RecordError(f"fields are not JSON-like: {e}") from None
        if digest != _field(record, "digest", str):
            raise RecordError("digest does not match its fields")
        return definition


MAX_DEFINITION_DEPTH = 8
"""Nesting a run definition may have (ours has 2); deeper ones would only exhaust the stack."""


def _depth(value: object) -> int:
    """How deeply lists and maps nest in `value`, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_DEFINITION_DEPTH:
                stack.extend(
                    (child, level + 1) for child in (item.values() if isinstance(item, dict) else item)
                )
    return deepest


def _flatten(fields: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(fields, dict):
        return {prefix: fields}
    flat: dict[str, object] = {}
    for name, value in fields.items():
        flat.update(_flatten(value, f"{prefix}.{name}" if prefix else str(name)))
    return flat


def diff_run_definitions(ours: RunDefinition, theirs: RunDefinition) -> list[tuple[str, object, object]]:
    """(field, our value, swarm's value) for every differing field; nested fields are dotted names."""
    mine, other = _flatten(ours.fields), _flatten(theirs.fields)
    missing = "<absent>"
    return [
        (name, mine.get(name, missing), other.get(name, missing))
        for name in sorted(set(mine) | set(other))
        if mine.get(name, missing) != other.get(name, missing)
    ]


def run_definition_key(run_name: str) -> str:
    return f"{KEY_PREFIX}/{run_name}/definition"


def read_definitions(dht: DHTLike, run_name: str, verify: bool = True) -> dict[str, RunDefinition]:
    """The run definitions published for the run, by publisher; malformed or forged ones dropped."""
    key = run_definition_key(run_name)
    found = dht.get(key, latest=True)
    entries = getattr(found, "value", None)
    if not isinstance(entries, dict):
        return {}
    published = {}
    for publisher, entry in entries.items():
        try:
            if not isinstance(publisher, str):
                raise RecordError(f"subkey of type {type(publisher).__name__}")
            published[publisher] = RunDefinition.decode(open_body(entry, key, publisher, verify))
        except RecordError as e:
            READ_DROPS.count(e.reason, f"ignoring malformed run definition of run {run_name!r}: {e}")
    return published


MAX_LIVENESS_LOOKUPS = 16
"""Publishers whose liveness record one check looks up, at most, on top of the live heartbeats."""


def _live_publishers(dht: DHTLike, publishers: list[str], live: set[str], verify: bool) -> list[str]:
    """The `publishers` that are live: a heartbeat in the run, or a `live` liveness record (a peer
    between its join and its first heartbeat). Unverified records prove nothing: with defences off
    (`verify` false) every publisher counts."""
    if not verify:
        return publishers
    found = [p for p in publishers if p in live]
    for publisher in [p for p in publishers if p not in live][:MAX_LIVENESS_LOOKUPS]:
        record = find_liveness(dht, publisher, verify)
        if record is not None and record.state == "live":
            found.append(publisher)
    return found


DEFINITION_HINTS = {
    "data_hash": "the data differs: data.corpus holds other files or other content",
    "tokenizer_hash": "the tokenizer differs: data.tokenizer is another file, or bytes on one side",
    "own_model.parameters": "the model differs: other parameter names, shapes or dtypes",
    "own_model.initial_weights": "the model starts from other weights: build it after "
    "torch.manual_seed(<one seed for the run>) on every peer",
}
"""What a differing field of the run definition means, where its name alone does not say it."""


def _mismatch(run_name: str, ours: RunDefinition, theirs: RunDefinition) -> RunDefinitionMismatch:
    differences = diff_run_definitions(ours, theirs)
    lines = "; ".join(
        f"{name}: ours={a!r}, swarm's={b!r}"
        + (f" ({DEFINITION_HINTS[name]})" if name in DEFINITION_HINTS else "")
        for name, a, b in differences
    )
    return RunDefinitionMismatch(
        f"refusing to join run {run_name!r}: its run definition differs from ours in "
        f"{len(differences)} field(s): {lines}. Use the swarm's config, or choose another run name"
    )


def check_run_definition(
    dht: DHTLike, run_name: str, ours: RunDefinition, ttl_s: float, signer: Signer, verify: bool = True
) -> None:
    """Refuse (`RunDefinitionMismatch`) to join a run whose live peers all publish another definition.

    Each peer publishes its own definition (subkey = its peer id), so a forged definition is only
    ever its forger's. This peer joins if a live peer publishes ours, or if no live peer publishes
    any; it then publishes ours (refreshing its expiration).
    """
    json.dumps(ours.fields)  # fail early, here, if the fields are not plain JSON-like data
    published = read_definitions(dht, run_name, verify)
    published.pop(signer.peer_id, None)
    same = [p for p, d in published.items() if d.digest == ours.digest]
    other = sorted(p for p, d in published.items() if d.digest != ours.digest)
    if other:
        live = {h.peer_id for h in list_live_peers(dht, run_name, verify=verify)}
        if _live_publishers(dht, same, live, verify):
            logger.info("%d peer(s) of run %r publish another run definition; joining", len(other), run_name)
        elif differing := _live_publishers(dht, other, live, verify):
            digests = [published[p].digest for p in differing]
            common = max(differing, key=lambda p: digests.count(published[p].digest))
            raise _mismatch(run_name, ours, published[common])
    key = run_definition_key(run_name)
    seal_and_store(dht, signer, key, signer.peer_id, ours.encode(), now() + ttl_s)


# ------------------------------------------------------------------------------------------------ liveness


@dataclass(frozen=True)
class Liveness:
    """A node announcing that its identity is in use (`live`) or was released (`stopped`)."""

    peer_id: str
    instance: str
    """Random per process, so a node recognises its own record."""
    state: str
    hostname: str
    pid: int

    def encode(self) -> bytes:
        return pack(asdict(self))

    @staticmethod
    def decode(data: object) -> Liveness:
        fields = unpack(data)
        liveness = Liveness(
            peer_id=_field(fields, "peer_id", str),
            instance=_field(fields, "instance", str),
            state=_field(fields, "state", str),
            hostname=_field(fields, "hostname", str),
            pid=_non_negative(fields, "pid", int),
        )
        if liveness.state not in ("live", "stopped"):
            raise RecordError(f"unknown state {liveness.state!r}")
        return liveness


def liveness_key(peer_id: str) -> str:
    return f"{KEY_PREFIX}/identity/{peer_id}"


def find_liveness(dht: DHTLike, peer_id: str, verify: bool = True) -> Liveness | None:
    """The latest liveness record of `peer_id`, or None if there is none (or it is malformed or forged)."""
    found = dht.get(liveness_key(peer_id), latest=True)
    if found is None:
        return None
    try:
        liveness = Liveness.decode(open_body(found, liveness_key(peer_id), None, verify))
        if liveness.peer_id != peer_id:
            raise RecordError(f"record of {liveness.peer_id} under the key of {peer_id}")
    except RecordError as e:
        READ_DROPS.count(e.reason, f"ignoring malformed liveness record of {peer_id}: {e}")
        return None
    return liveness


def publish_liveness(dht: DHTLike, liveness: Liveness, ttl_s: float, signer: Signer) -> bool:
    if liveness.peer_id != signer.peer_id:
        raise RecordError(f"liveness record of {liveness.peer_id} cannot be signed by {signer.peer_id}")
    body = liveness.encode()
    return seal_and_store(dht, signer, liveness_key(liveness.peer_id), None, body, now() + ttl_s)
