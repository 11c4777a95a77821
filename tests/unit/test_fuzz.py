"""The fuzz targets of `bench.fuzz`, with a hundred generated inputs each (the bench runs 10,000).

Every decoder of network input must return a value or raise its own error type, and the consumers
of decoded records must stay in range and keep no one out without a validly signed record, for any
input hypothesis generates. A frame announcing more than its bound is refused before anything of
that size is reserved or waited for.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Awaitable, Callable

import msgpack
import pytest
import torch
from hypothesis import strategies as st
from nacl.signing import SigningKey

from bench import fuzz
from p2p_trainer.net import direct, message_relay, records, transport
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.frames import FrameReader

CASES = 100


@pytest.fixture(autouse=True)
def subnormal_floats() -> None:
    """Hypothesis generates subnormal floats and refuses to run where they flush to zero, which a
    peer's training thread turns on (`inner.flush_denormal`); a test that ran a peer in this
    process before would leave it on."""
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("name", sorted(fuzz.TARGETS))
def test_no_input_escapes_the_decoders_error_type(name: str) -> None:
    out = fuzz.run_target(name, CASES)
    assert out["error"] is None, out
    assert out["cases"] >= CASES // 2, out  # hypothesis really generated inputs


def test_the_harness_reports_an_escaped_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def leaky(raw: bytes) -> None:
        if len(raw) > 3:
            raise KeyError("escaped")

    monkeypatch.setitem(fuzz.TARGETS, "leaky", (leaky, (st.binary(max_size=16),)))
    out = fuzz.run_target("leaky", 50)
    assert out["error"] is not None and out["error"].startswith("KeyError"), out


def test_a_run_definition_with_bytes_or_deep_nesting_is_a_record_error() -> None:
    with_bytes = msgpack.packb({"digest": "x", "fields": {"model": b"\x00"}}, use_bin_type=True)
    with pytest.raises(records.RecordError, match="not JSON-like"):
        records.RunDefinition.decode(with_bytes)
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(40):
        inner["a"] = {}
        inner = inner["a"]  # type: ignore[assignment]
    nested = msgpack.packb({"digest": "x", "fields": deep}, use_bin_type=True)
    with pytest.raises(records.RecordError, match="nest deeper"):
        records.RunDefinition.decode(nested)


TERABYTE = (2**40).to_bytes(direct.LENGTH_BYTES, direct.BYTEORDER)
"""A frame's length prefix announcing 2**40 bytes."""


def test_a_frame_announcing_a_terabyte_is_refused_before_anything_of_its_size_is_reserved() -> None:
    refused: list[ValueError] = []

    async def serve(conn: FrameReader) -> None:
        try:
            await conn.request(direct.MAX_HELLO_BYTES)
        except ValueError as exc:
            refused.append(exc)

    tracemalloc.start()
    t0 = time.perf_counter()
    wire = asyncio.run(fuzz.feed(FrameReader(direct.LENGTH_BYTES, direct.BYTEORDER, serve), TERABYTE))
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [str(e) for e in refused] == [f"frame of {2**40} bytes exceeds the limit of 512"]
    assert wire.closed and elapsed < 1.0 and peak < 1 << 20, (wire.closed, elapsed, peak)


@pytest.mark.parametrize("read_frame", [direct.read_frame, transport.read_frame])
def test_a_stream_frame_announcing_a_terabyte_is_refused_before_it_is_read(
    read_frame: Callable[[asyncio.StreamReader, int], Awaitable[bytes]],
) -> None:
    async def read() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(TERABYTE)  # and nothing more, not even the stream's end
        return await asyncio.wait_for(read_frame(reader, 512), 1.0)

    with pytest.raises(ValueError, match=f"frame of {2**40} bytes exceeds the limit of 512"):
        asyncio.run(read())


def test_a_relay_refuses_a_frame_announcing_a_terabyte_before_reading_or_forwarding_it() -> None:
    target = Signer(SigningKey(bytes(32))).peer_id
    route = fuzz.frame(msgpack.packb({"to": target}))
    meta = fuzz.frame(b"meta")
    t0 = time.perf_counter()
    cases = {
        "routing": (fuzz.relay(TERABYTE, reachable=True, eof=False), b"", b""),
        "meta": (fuzz.relay(route + TERABYTE, reachable=True, eof=False), message_relay.OPEN, b""),
        "payload": (
            fuzz.relay(route + meta + fuzz.frame(b"h") + TERABYTE, reachable=True, eof=False),
            message_relay.OPEN,
            meta + fuzz.frame(b"h"),
        ),
    }
    assert time.perf_counter() - t0 < 1.0  # none waited for the announced bytes
    for name, (out, answered, forwarded) in cases.items():
        assert out.service.refused == 1 and out.service.forwarded == 0, name
        assert (out.answered, out.forwarded) == (answered, forwarded), name


def test_the_entry_target_catches_a_joiner_kept_out_by_a_forged_definition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    theirs = records.RunDefinition({"method": "diloco", "seed": 0}).encode()
    forged: list[fuzz.Published] = [(1, 2, [], theirs)]  # peer 1's run definition, sealed with peer 2's key
    beating: list[fuzz.Published] = [(1, 1, [], False)]  # peer 1 is live
    fuzz.fuzz_entry_checks(forged, beating, [])  # the forgery is dropped: the joiner joins
    read = records.read_definitions
    monkeypatch.setattr(records, "read_definitions", lambda dht, run, verify=True: read(dht, run, False))
    with pytest.raises(AssertionError):
        fuzz.fuzz_entry_checks(forged, beating, [])
