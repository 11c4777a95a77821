"""Fuzz every decoder of network input, and the code that consumes what they let through.

`python -m bench.fuzz --cases 10000` runs each target under hypothesis with that many generated
inputs and prints a table (target, cases, seconds, rejections by error type); it exits non-zero if
any input raised anything but the decoder's own error type. `tests/unit/test_fuzz.py` runs the same
targets with a few hundred cases each in `make test`.

The decoders (stream headers, contribution messages, DHT record bodies, signed envelopes,
invitations, donor state headers) must either return a value or raise their own error type, for any bytes or any
well-formed map with hostile fields. The consumers (view bounds, round alignment, rejoin target,
the estimate of a peer's round, donor order and refusal) get whatever heartbeat a decoder accepts,
with every numeric field anywhere in its valid range, and must neither raise nor return something
out of range.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import nacl.signing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.exchange.interface import Failed
from p2p_trainer.net import envelope, records
from p2p_trainer.net.admission import Admission, Invitation, InvitationError, issue
from p2p_trainer.net.align import steps_late
from p2p_trainer.net.donor_check import round_refusal
from p2p_trainer.net.identity import B58_ALPHABET
from p2p_trainer.net.state_sync import check_state_header, donor_order
from p2p_trainer.net.transport import MAX_HEADER_BYTES, Message, MessageError, decode_header
from p2p_trainer.net.view_bounds import HeartbeatBounds, ReplayFilter, bound_heartbeats, median_round
from p2p_trainer.net.wire import check_message
from p2p_trainer.run.entry_paths import estimated_round, rejoin_target

U64 = 2**64 - 1
"""msgpack's largest unsigned integer: the largest int a decoder can be handed."""

# ------------------------------------------------------------------------------------------------ inputs

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=U64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.binary(max_size=300),
)
_values = st.recursive(
    _scalars,
    max_leaves=12,
    extend=lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
)
_peer_ids = st.text(alphabet=B58_ALPHABET, min_size=1, max_size=60)


def _mutated_map(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Maps whose keys are drawn mostly from a decoder's field names, with hostile values."""
    keys = st.one_of(st.sampled_from(names), st.text(max_size=12))
    return st.dictionaries(keys, _values, max_size=len(names) + 3)


def _packed(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda v: bytes(msgpack.packb(v, use_bin_type=True)))


def _raw_or_packed(names: list[str]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=6000), _packed(_mutated_map(names)), _packed(_values))


HEARTBEAT_FIELDS = [f for f in records.Heartbeat.__dataclass_fields__]
LIVENESS_FIELDS = [f for f in records.Liveness.__dataclass_fields__]


def _heartbeats() -> st.SearchStrategy[records.Heartbeat]:
    """Heartbeats as a decoder lets them through: finite, non-negative, any magnitude."""
    big = st.floats(min_value=0.0, max_value=1.7e308, allow_nan=False, allow_infinity=False)
    return st.builds(
        records.Heartbeat,
        peer_id=_peer_ids,
        round=st.integers(min_value=0, max_value=U64),
        tokens_processed=st.integers(min_value=0, max_value=U64),
        loss=st.none() | big,
        throughput_tokens_per_s=big,
        software_version=st.text(min_size=1, max_size=20),
        timestamp=big,
        leaving=st.booleans(),
        round_started=big,
        suspects=st.lists(_peer_ids, max_size=4).map(tuple),
    )


# ------------------------------------------------------------------------------------------------ targets


def fuzz_stream_header(raw: bytes) -> None:
    with contextlib.suppress(MessageError):
        decode_header(raw)


def fuzz_contribution(header: dict[str, Any], payload: bytes, expected: int) -> None:
    out = check_message(Message("sender", header, payload), expected, 4.0)
    assert isinstance(out, str) or (len(out[0]) == expected and 0 < out[1] <= 4.0), out


def fuzz_heartbeat_record(raw: bytes) -> None:
    with contextlib.suppress(records.RecordError):
        records.Heartbeat.decode(raw)


def fuzz_liveness_record(raw: bytes) -> None:
    with contextlib.suppress(records.RecordError):
        records.Liveness.decode(raw)


def fuzz_run_definition(raw: bytes) -> None:
    with contextlib.suppress(records.RecordError):
        records.RunDefinition.decode(raw)


_SIGNER = nacl.signing.SigningKey(bytes(range(32)))
_VALID = envelope.Signer(_SIGNER).seal("p2p-trainer/fuzz/peers", None, 1e9, b"body")


def fuzz_envelope(raw: bytes, flips: list[int]) -> None:
    data = bytearray(raw if raw else _VALID)
    for at in flips:  # flipped bits in a valid envelope reach the signature check, not just msgpack
        if data:
            data[at % len(data)] ^= 1 << (at % 8)
    with contextlib.suppress(envelope.EnvelopeError):
        envelope.open_verified(bytes(data), "p2p-trainer/fuzz/peers", None, 1e9)


_OWNER = nacl.signing.SigningKey(bytes(range(1, 33)))
_INVITATION = issue(_OWNER, "fuzz", "12D3KooWfuzz", 4e9).encode()
_ADMISSION = Admission(
    SecurityConfig(admission="invitations", owners=(envelope.Signer(_OWNER).peer_id,)), "fuzz"
)


def fuzz_invitation(text: str, flips: list[int]) -> None:
    chars = list(text if text else _INVITATION)
    for at in flips:  # changed characters of a valid invitation reach the signature check
        if chars:
            chars[at % len(chars)] = chr(ord(chars[at % len(chars)]) ^ 1)
    mutated = "".join(chars)
    with contextlib.suppress(InvitationError):
        Invitation.decode(mutated).verify()
    why = _ADMISSION.refusal("12D3KooWfuzz", mutated, now=1e9)
    assert why is None or isinstance(why, str), why


def fuzz_state_header(header: dict[str, Any]) -> None:
    out = check_state_header(header, "12D3KooWfuzz")
    assert isinstance(out, Failed) or (out[0] >= 0 and all(0 <= t < 1e7 for t in out[1])), out


def fuzz_consumers(beats: list[records.Heartbeat], own_round: int, now: float) -> None:
    bounds = HeartbeatBounds()
    kept = bound_heartbeats(beats, own_round, now, bounds, ReplayFilter(forget_after_s=60.0))
    late = steps_late(own_round, now, kept, "self", 1.0, 0.05, 20, robust=True)
    assert 0 <= late <= 19, late
    rounds = [b.round for b in kept if not b.leaving]
    rejoin_target(own_round, rounds, 3)
    median = median_round([own_round, *rounds])
    for beat in kept:
        assert isinstance(estimated_round(beat, now, 2560), int)
        round_refusal(beat.round, median, 10_000, bounds.round_window)
    donor_order("self", [(b.peer_id, b.round) for b in kept])


TARGETS: dict[str, tuple[Callable[..., None], tuple[st.SearchStrategy[Any], ...]]] = {
    "stream header": (
        fuzz_stream_header,
        (st.one_of(st.binary(max_size=MAX_HEADER_BYTES + 64), _packed(_values)),),
    ),
    "contribution message": (
        fuzz_contribution,
        (_mutated_map(["key", "w", "dt", "part", "members"]), st.binary(max_size=256), st.integers(0, 64)),
    ),
    "heartbeat record": (fuzz_heartbeat_record, (_raw_or_packed(HEARTBEAT_FIELDS),)),
    "liveness record": (fuzz_liveness_record, (_raw_or_packed(LIVENESS_FIELDS),)),
    "run definition record": (fuzz_run_definition, (_raw_or_packed(["digest", "fields"]),)),
    "signed envelope": (
        fuzz_envelope,
        (
            st.one_of(
                st.just(b""),
                st.binary(max_size=5000),
                _packed(_mutated_map(["v", "key", "pk", "sig", "body"])),
            ),
            st.lists(st.integers(0, 10_000), max_size=4),
        ),
    ),
    "invitation": (
        fuzz_invitation,
        (st.one_of(st.just(""), st.text(max_size=600)), st.lists(st.integers(0, 10_000), max_size=3)),
    ),
    "state header": (
        fuzz_state_header,
        (_mutated_map(["round", "round_elapsed_s", "step_s", "sha256", "error"]),),
    ),
    "record consumers": (
        fuzz_consumers,
        (
            st.lists(_heartbeats(), max_size=8),
            st.integers(min_value=0, max_value=10**6),
            st.floats(min_value=0.0, max_value=4e9, allow_nan=False),
        ),
    ),
}


def run_target(name: str, cases: int) -> dict[str, Any]:
    """Run one target for `cases` inputs; returns counts and any exception that escaped."""
    fn, strategies = TARGETS[name]
    seen: Counter[str] = Counter()

    def counted(args: tuple[Any, ...]) -> None:
        seen["inputs"] += 1
        fn(*args)

    test = settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )(given(st.tuples(*strategies))(counted))
    t0 = time.perf_counter()
    error = None
    try:
        test()
    except Exception as exc:  # report the first input that escaped, with its type
        error = f"{type(exc).__name__}: {exc}"[:500]
    return {"target": name, "cases": seen["inputs"], "seconds": time.perf_counter() - t0, "error": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="inputs per target (default 10000)")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="only these targets")
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error("--cases must be at least 1")
    rows = [run_target(name, args.cases) for name in (args.target or list(TARGETS))]
    print("| target | cases | seconds | result |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['target']} | {r['cases']} | {r['seconds']:.1f} | {r['error'] or 'no escaped exception'} |"
        )
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
