"""The metrics records: every kind round-trips, bad lines are refused by field, torn lines skipped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from p2p_trainer.round_log import (
    SCHEMA,
    ExchangeRecord,
    FinalRecord,
    LogRecord,
    LogTail,
    RejoinRecord,
    ResumeRecord,
    RoundLogError,
    RoundRecord,
    StartRecord,
    parse_record,
    read_log,
)
from p2p_trainer.train.metrics import MetricsWriter

EXCHANGE = ExchangeRecord(
    "mix2",
    True,
    2,
    elapsed_s=0.4826,
    blocked_s=0.4841,
    bytes_sent=6703104,
    bytes_received=6703104,
    left_out=("a1b2c3d4",),
    own_parts=1,
    late_parts=0,
    started_unix=1796120230.0875,
    group="7c892dc4/mix2/0/0/36a0d2",
)
ROUND = RoundRecord(
    peer="12D3KooW",
    time_s=8.5,
    unix_time=1796120231.5,
    round=0,
    step=20,
    tokens=40960,
    train_loss=4.57,
    val_loss=None,
    compute_s=7.05,
    blocked_s=0.48,
    wall_s=7.54,
    round_tokens=40960,
    live_peers=2,
    skipped_steps=0,
    bytes_sent=6703104,
    bytes_received=6703104,
    exchanges=(EXCHANGE, ExchangeRecord("mix1", False, 1, 30.0, 0.5, reason="timed out")),
)
EVERY_KIND: list[LogRecord] = [
    StartRecord("12D3KooW", 1796120223.03, "7c892dc4", "factored"),
    ResumeRecord(3, "31d1051d"),
    ROUND,
    RejoinRecord(from_round=4, to_round=9, catch_up_steps=2),
    FinalRecord("12D3KooW", 2, 81920, 2.98, 19.3, False, "31d1051d", 40),
]


@pytest.mark.parametrize("record", EVERY_KIND, ids=lambda r: r.KIND)
def test_every_kind_round_trips_through_its_json_line(record: LogRecord) -> None:
    line = json.loads(record.to_json())
    assert line["kind"] == record.KIND and line["schema"] == SCHEMA
    assert parse_record(line) == record
    assert type(record).from_dict(record.to_dict()) == record


def test_round_line_keeps_the_field_names_readers_know() -> None:
    line = ROUND.to_dict()
    assert line["exchanges"][0]["left_out"] == ["a1b2c3d4"]  # tuples are JSON lists
    assert {"round_tokens", "live_peers", "skipped_steps", "bytes_sent", "exchanges"} <= set(line)
    assert set(line["exchanges"][0]) >= {"tag", "ok", "group_size", "elapsed_s", "reason", "group"}


def test_exchange_seconds_are_written_to_four_decimals() -> None:
    precise = ExchangeRecord("outer", True, 2, elapsed_s=0.123456789, blocked_s=1 / 3)
    assert precise.to_dict()["elapsed_s"] == 0.1235 and precise.to_dict()["blocked_s"] == 0.3333


def test_a_field_of_the_wrong_type_is_refused_by_name() -> None:
    line = ROUND.to_dict()
    line["exchanges"][1]["ok"] = "yes"
    with pytest.raises(RoundLogError, match=r"RoundRecord\.exchanges\[1\]\.ok: expected bool, got str"):
        parse_record(line)
    for field, value in [("round", 1.5), ("round", True), ("train_loss", "4.5"), ("exchanges", {})]:
        with pytest.raises(RoundLogError, match=rf"RoundRecord\.{field}: expected"):
            parse_record({**ROUND.to_dict(), field: value})


def test_a_missing_or_unknown_field_is_refused_by_name() -> None:
    line = ROUND.to_dict()
    del line["train_loss"]
    with pytest.raises(RoundLogError, match=r"RoundRecord\.train_loss: missing"):
        parse_record(line)
    with pytest.raises(RoundLogError, match=r"unknown field.*'epoch'"):
        parse_record({**ROUND.to_dict(), "epoch": 3})


def test_a_newer_schema_or_an_unknown_kind_is_refused() -> None:
    with pytest.raises(RoundLogError, match=f"schema {SCHEMA + 1} is newer"):
        parse_record({**ROUND.to_dict(), "schema": SCHEMA + 1})
    with pytest.raises(RoundLogError, match="unknown kind 'eval'"):
        parse_record({"kind": "eval", "schema": SCHEMA})
    with pytest.raises(RoundLogError, match="unknown kind None"):
        parse_record({"schema": SCHEMA})


def test_lines_without_a_schema_are_read_as_they_were_written() -> None:
    """Before versioning: no `schema`, no per-exchange bytes, extra fields, null reasons."""
    old_round = {k: v for k, v in ROUND.to_dict().items() if k not in ("kind", "schema")}
    old_round["exchanges"] = [
        {"tag": "hivemind", "ok": True, "group_size": 0, "elapsed_s": 1.5, "reason": None}
    ]
    old_round["blocked_s"] = 1.5
    with pytest.raises(RoundLogError, match="blocked_s: missing"):  # required fields stay required
        parse_record({"kind": "round", **old_round})
    old_round["exchanges"][0]["blocked_s"] = 1.5
    parsed = parse_record({"kind": "round", "epoch": 7, **old_round})
    assert isinstance(parsed, RoundRecord)
    assert parsed.exchanges == (ExchangeRecord("hivemind", True, 0, 1.5, 1.5),)


def test_the_reader_skips_a_torn_line_and_names_the_line_of_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "peer0" / "metrics.jsonl"
    assert read_log(path).records == ()  # not written yet
    writer = MetricsWriter(path)
    for record in EVERY_KIND:
        writer.write(record)
    writer.close()
    whole = path.read_text()
    torn = ROUND.to_json()[:57]  # the writer was killed mid-line
    path.write_text(whole + torn)
    log = read_log(path)
    assert log.records == tuple(EVERY_KIND) and log.torn == 1
    # a restarted writer appends to the torn line: that line is lost, the next ones are not
    path.write_text(whole + torn + StartRecord("12D3KooW", 2.0).to_json() + "\n" + ROUND.to_json() + "\n")
    log = read_log(path)
    assert log.records == (*EVERY_KIND, ROUND) and log.torn == 1
    path.write_text(whole + json.dumps({**ROUND.to_dict(), "tokens": "many"}) + "\n")
    with pytest.raises(RoundLogError, match=r"metrics\.jsonl:6: RoundRecord\.tokens: expected int"):
        read_log(path)


def test_views_split_the_log_by_kind_and_by_life(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    start = StartRecord("p", 1.0)
    later = dataclasses.replace(ROUND, round=5)
    path.write_text("".join(r.to_json() + "\n" for r in [ROUND, start, ROUND, start, later, EVERY_KIND[-1]]))
    log = read_log(path)
    assert log.rounds == [ROUND, ROUND, later] and log.starts == [start, start]
    assert log.final == EVERY_KIND[-1] and log.resumes == [] and log.rejoins == []
    lives = log.lives()
    assert [len(life.starts) for life in lives] == [0, 1, 1]  # rounds before any start form a life
    assert [[r.round for r in life.rounds] for life in lives] == [[0], [0], [5]]


def test_a_tail_reads_what_was_appended_as_the_whole_file_reads(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = LogTail(path)
    assert tail.read().records == ()  # not written yet
    lines = [r.to_json() + "\n" for r in EVERY_KIND]
    with path.open("a") as f:
        f.write(lines[0] + lines[1][:20])  # a line still being written is not read yet
        f.flush()
        assert tail.read().records == (EVERY_KIND[0],)
        f.write(lines[1][20:] + ROUND.to_json()[:57])  # then a writer killed mid-line
        f.flush()
        assert tail.read().records == tuple(EVERY_KIND[:2])
        f.write(StartRecord("p", 2.0).to_json() + "\n" + lines[2])  # appended to the torn line
    log = tail.read()
    assert log == read_log(path) and log.records == (*EVERY_KIND[:2], ROUND) and log.torn == 1
    path.write_text(lines[4])  # replaced (a new run in the same place): read from its start
    assert tail.read().records == (EVERY_KIND[4],)


def test_a_rounds_refused_records_are_counted_by_reason_and_older_lines_still_read() -> None:
    from p2p_trainer.net.envelope import DropCounter, DropTally
    from p2p_trainer.round_log import DropCount

    read, stored = DropCounter("test reads"), DropCounter("test stores")
    read.count("not-admitted", "before the first round")  # counted before the tally starts: not this round's

    def gone() -> dict[str, int]:
        raise RuntimeError("the DHT process has shut down")

    tally = DropTally({"read": read.counts, "stored": stored.counts, "gone": gone})
    for _ in range(3):
        read.count("not-admitted", "an uninvited peer")
    read.count("implausible", "a round far ahead")
    stored.count("bad-signature", "a forged heartbeat")
    got = tuple(DropCount(*d) for d in tally.take())
    assert got == (
        DropCount("read", "implausible", 1),
        DropCount("read", "not-admitted", 3),
        DropCount("stored", "bad-signature", 1),
    )
    assert tally.take() == []  # nothing new since
    record = dataclasses.replace(ROUND, dropped=got)
    line = record.to_dict()
    assert line["dropped"][1] == {"source": "read", "reason": "not-admitted", "count": 3}
    assert parse_record(json.loads(json.dumps(line))) == record
    older = {k: v for k, v in ROUND.to_dict().items() if k != "dropped"} | {"schema": 2}
    assert parse_record(older) == ROUND and ROUND.dropped == ()
