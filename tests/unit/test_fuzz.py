"""The fuzz targets of `bench.fuzz`, with a hundred generated inputs each (the bench runs 10,000).

Every decoder of network input must return a value or raise its own error type, and the consumers
of decoded heartbeats must stay in range, for any input hypothesis generates.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import strategies as st

from bench import fuzz
from p2p_trainer.net import records

CASES = 100


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
