"""The heartbeat's progress fields (step, bytes, reachability, last exchange): bounds, older
heartbeats, size, and how `status` shows them."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import msgpack
import pytest

from bench.fuzz.fakes import DictDHT
from p2p_trainer.net import records
from p2p_trainer.net.envelope import MAX_ENVELOPE_BYTES
from p2p_trainer.net.reach import Reachability
from p2p_trainer.net.records import Heartbeat, RecordError
from p2p_trainer.net.status_client import read_status
from p2p_trainer.net.status_command import status_dict, status_table
from p2p_trainer.round_log import EXCHANGE_OUTCOMES, ExchangeRecord
from p2p_trainer.run.round_lines import round_outcome
from tests.unit.test_record_bounds import SIGNERS

pytestmark = pytest.mark.timeout(30)

SIGNER = SIGNERS[0]
PEER = SIGNER.peer_id


def beat(**changes: Any) -> Heartbeat:
    full = Heartbeat(
        PEER,
        7,
        4480,
        2.4,
        900.0,
        "0.1.0",
        records.now(),
        step=147,
        round_step=7,
        round_steps=20,
        bytes_sent=1_500_000,
        bytes_received=1_400_000,
        reachability="reachable",
        last_exchange="partial",
    )
    return replace(full, **changes)


def raw(fields: dict[str, object]) -> bytes:
    return bytes(msgpack.packb(fields, use_bin_type=True))


def test_the_progress_fields_round_trip() -> None:
    sent = beat()
    assert Heartbeat.decode(sent.encode()) == sent
    # unset (0, "") they are left out of the record, which then reads as an older peer's
    unset = beat(
        step=0, round_step=0, round_steps=0, bytes_sent=0, bytes_received=0, reachability="", last_exchange=""
    )
    assert not set(records.PROGRESS_FIELDS) & set(msgpack.unpackb(unset.encode()))
    assert Heartbeat.decode(unset.encode()) == unset


def test_a_heartbeat_of_an_older_peer_decodes_with_the_defaults() -> None:
    new = {
        "step",
        "round_step",
        "round_steps",
        "bytes_sent",
        "bytes_received",
        "reachability",
        "last_exchange",
    }
    old = {k: v for k, v in asdict(beat()).items() if k not in new and k != "invitation"}
    got = Heartbeat.decode(raw(old))
    assert (got.step, got.round_step, got.round_steps, got.bytes_sent, got.bytes_received) == (0, 0, 0, 0, 0)
    assert got.reachability == "" and got.last_exchange == "" and got.round == 7


BAD: dict[str, dict[str, object]] = {
    "negative-step": {"step": -1},
    "bool-step": {"step": True},
    "float-step": {"step": 3.0},
    "huge-step": {"step": records.MAX_STEPS},
    "huge-bytes": {"bytes_sent": records.MAX_BYTES},
    "negative-bytes": {"bytes_received": -5},
    "str-bytes": {"bytes_received": "12"},
    "huge-round-steps": {"round_steps": records.MAX_ROUND_STEPS},
    "step-past-round": {"round_step": 21, "round_steps": 20},
    "long-reachability": {"reachability": "r" * 5000},
    "int-reachability": {"reachability": 1},
    "list-outcome": {"last_exchange": ["ok"]},
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_out_of_bounds_progress_field_is_refused(name: str) -> None:
    fields = {**asdict(beat()), **BAD[name]}
    del fields["invitation"]
    with pytest.raises(RecordError):
        Heartbeat.decode(raw(fields))


def test_a_word_this_version_does_not_know_reads_as_not_reported() -> None:
    # a newer peer's word for a display-only field must not make its whole heartbeat invalid
    fields = {**asdict(beat()), "reachability": "relayed", "last_exchange": "merged"}
    del fields["invitation"]
    got = Heartbeat.decode(raw(fields))
    assert got.reachability == "" and got.last_exchange == ""
    assert got.round == beat().round and got.step == beat().step and got.peer_id == beat().peer_id


def test_every_word_of_the_vocabularies_is_accepted() -> None:
    for word in records.REACHABILITY:
        assert Heartbeat.decode(beat(reachability=word).encode()).reachability == word
    for word in EXCHANGE_OUTCOMES:
        assert Heartbeat.decode(beat(last_exchange=word).encode()).last_exchange == word


def test_the_largest_heartbeat_fits_a_record() -> None:
    suspects = tuple(signer.peer_id for signer in SIGNERS) * (records.MAX_SUSPECTS // len(SIGNERS) + 1)
    biggest = beat(
        peer_id=PEER,
        round=2**62,
        tokens_processed=2**62,
        software_version="v" * 128,
        suspects=suspects[: records.MAX_SUSPECTS],
        invitation="i" * records.MAX_INVITATION_CHARS,
        step=records.MAX_STEPS - 1,
        round_step=records.MAX_ROUND_STEPS - 1,
        round_steps=records.MAX_ROUND_STEPS - 1,
        bytes_sent=records.MAX_BYTES - 1,
        bytes_received=records.MAX_BYTES - 1,
        reachability=max(records.REACHABILITY, key=len),
        last_exchange=max(EXCHANGE_OUTCOMES, key=len),
        excludes=tuple((peer, records.MAX_STEPS - 3, records.MAX_STEPS - 2) for peer in suspects)[
            : records.MAX_EXCLUDES
        ],
    )
    body = biggest.encode()
    assert len(body) < records.MAX_RECORD_BYTES
    assert Heartbeat.decode(body) == biggest
    key = records.heartbeat_key("a-long-swarm-name" * 4)
    assert len(SIGNER.seal(key, PEER, records.now() + 30, body)) <= MAX_ENVELOPE_BYTES


@pytest.mark.parametrize(
    ("reach", "word"),
    [
        (Reachability(True, 4001, ("10.0.0.2",), "10.0.0.2"), "reachable"),
        (Reachability(False, 4001, ("10.0.0.2",), "198.51.100.7"), "behind-nat"),
        (Reachability(False, 4001, ("10.0.0.2",), "10.0.0.2"), "unreachable"),
        (Reachability(None, 4001, ("10.0.0.2",)), "unchecked"),
    ],
)
def test_the_reachability_check_gives_a_word_of_the_vocabulary(reach: Reachability, word: str) -> None:
    assert reach.verdict == word and word in records.REACHABILITY


def test_a_round_reports_its_worst_exchange() -> None:
    ok = ExchangeRecord("outer", True, 3, 0.5, 0.1)
    partial = ExchangeRecord("mix1", True, 2, 0.1, 0.1, left_out=("x",))
    failed = ExchangeRecord("outer", False, 0, 0.1, 0.1, reason="timeout")
    assert round_outcome([]) == ""
    assert round_outcome([ok]) == "ok"
    assert round_outcome([ok, partial]) == "partial"
    assert round_outcome([failed, ok, partial]) == "failed"


def test_status_shows_the_progress_fields_and_an_older_peer_as_unknown() -> None:
    dht, now = DictDHT(), records.now()
    a, b = SIGNERS[:2]
    records.publish_heartbeat(dht, "run", beat(peer_id=a.peer_id, timestamp=now), 30, a)
    old = Heartbeat(b.peer_id, 3, 100, None, 0.0, "0.0.9", now)  # says none of the new fields
    records.publish_heartbeat(dht, "run", old, 30, b)
    status = read_status(dht, "run", {})
    shown = {p["peer_id"]: p for p in status_dict(status)["peers"]}
    row = shown[a.peer_id]
    assert (row["step"], row["round_step"], row["round_steps"]) == (147, 7, 20)
    assert (row["bytes_sent"], row["bytes_received"]) == (1_500_000, 1_400_000)
    assert row["reachability"] == "reachable" and row["last_exchange"] == "partial"
    assert shown[b.peer_id]["reachability"] is None and shown[b.peer_id]["last_exchange"] is None
    table = status_table(status)
    cells = {c.header: list(c.cells) for c in table.columns}
    order = [p.heartbeat.peer_id for p in status.peers]
    i, j = order.index(a.peer_id), order.index(b.peer_id)
    assert cells["step"][i] == "7/20 (147)" and cells["step"][j] == "-"
    assert cells["sent/received"][i] == "1.5 MB / 1.4 MB"
    assert cells["reach"][i] == "reachable" and cells["reach"][j] == "-"
    assert cells["exchange"][i] == "partial" and cells["exchange"][j] == "-"
