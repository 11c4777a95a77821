"""Fuzz every decoder of network input, and the code that consumes what they let through.

`python -m bench.fuzz --cases 10000` runs each target under hypothesis with that many generated
inputs and prints a table (target, cases, seconds, result); it exits non-zero if any input raised
anything but the decoder's own error type, or broke one of the target's assertions.
`tests/unit/test_fuzz.py` runs the same targets with a hundred cases each in `make test`.

The decoders must either return a value or raise their own error type, for any bytes or any
well-formed map with hostile fields: stream headers, contribution messages, the values of every
wire format (sized as their header says), the members a part owner's result names, DHT record bodies,
signed envelopes, invitations, revocations, donor state headers, the DHT record validator
(`check_record`), the meta frame of a relayed message, and, driven through their handlers over
fake sockets, the direct data plane (handshake and sealed frames, through `FrameReader`), the
relay's routing frame and the dial-back requests and answers. Signed inputs are also given with
valid signatures and bits flipped, so that they reach the signature checks.

The consumers get whatever a decoder lets through and must neither raise nor return something
out of range: view bounds, round alignment, rejoin target, the estimate of a peer's round, donor
order and refusal (heartbeats with every numeric field anywhere in its valid range), and the swarm
view itself with the groups drawn from it (`view_target.py`: its members, tombstones, and honest
peers kept in view whatever one liar publishes). Those of
records that can keep a peer out must do so only on a record validly signed by the right key:
published revocations (`learn_published`), the joiner's run definition check and the liveness
record behind "identity already live"; a connection that fails its handshake must give back its
slots, and a relay must forward only within its limits.
"""

from __future__ import annotations

import argparse
import math
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz.consumers import (
    _OURS,
    _THEIRS,
    Published,
    _published,
    _revocation_texts,
    fuzz_consumers,
    fuzz_entry_checks,
    fuzz_revocation_records,
)
from bench.fuzz.decoders import (
    _SLOTS,
    _VALID,
    _revocation_maps,
    fuzz_envelope,
    fuzz_heartbeat_record,
    fuzz_invitation,
    fuzz_liveness_record,
    fuzz_raw_record,
    fuzz_record_validator,
    fuzz_revocation,
    fuzz_run_definition,
)
from bench.fuzz.direct_plane import _ANSWER, _HELLO, _hellos, fuzz_direct_frames, fuzz_direct_handshake
from bench.fuzz.fakes import Wire, feed
from bench.fuzz.inputs import (
    HEARTBEAT_FIELDS,
    LIVENESS_FIELDS,
    U64,
    _flips,
    _heartbeats,
    _mutated_map,
    _packed,
    _peer_index,
    _raw_or_packed,
    _tails,
    _values,
    frame,
)
from bench.fuzz.stream_targets import (
    RELAY_LIMITS,
    Relayed,
    _relay_routes,
    fuzz_contribution,
    fuzz_dialback_answer,
    fuzz_dialback_request,
    fuzz_relay_route,
    fuzz_relayed_meta,
    fuzz_result_members,
    fuzz_state_header,
    fuzz_stream_header,
    fuzz_wire_values,
    relay,
    sized_payloads,
)
from bench.fuzz.view_target import SWARM_VIEW
from p2p_trainer.net import owner_text, revocation
from p2p_trainer.net.record_validator import MAX_TTL_S
from p2p_trainer.net.transport import MAX_HEADER_BYTES

__all__ = [
    "HEARTBEAT_FIELDS",
    "LIVENESS_FIELDS",
    "RELAY_LIMITS",
    "TARGETS",
    "U64",
    "Published",
    "Relayed",
    "Wire",
    "feed",
    "frame",
    "fuzz_consumers",
    "fuzz_contribution",
    "fuzz_dialback_answer",
    "fuzz_dialback_request",
    "fuzz_direct_frames",
    "fuzz_direct_handshake",
    "fuzz_entry_checks",
    "fuzz_envelope",
    "fuzz_heartbeat_record",
    "fuzz_invitation",
    "fuzz_liveness_record",
    "fuzz_raw_record",
    "fuzz_record_validator",
    "fuzz_relay_route",
    "fuzz_relayed_meta",
    "fuzz_result_members",
    "fuzz_revocation",
    "fuzz_revocation_records",
    "fuzz_run_definition",
    "fuzz_state_header",
    "fuzz_stream_header",
    "fuzz_wire_values",
    "main",
    "relay",
    "run_target",
    "sized_payloads",
]


TARGETS: dict[str, tuple[Callable[..., None], tuple[st.SearchStrategy[Any], ...]]] = {
    "stream header": (
        fuzz_stream_header,
        (st.one_of(st.binary(max_size=MAX_HEADER_BYTES + 64), _packed(_values)),),
    ),
    "contribution message": (
        fuzz_contribution,
        (_mutated_map(["key", "w", "dt", "part", "members"]), st.binary(max_size=256), st.integers(0, 64)),
    ),
    "wire values": (fuzz_wire_values, (sized_payloads,)),
    "result members": (
        fuzz_result_members,
        (
            st.one_of(_values, st.lists(st.one_of(st.integers(-2, 6), st.booleans()), max_size=8)),
            st.integers(1, 5),
        ),
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
            _flips,
        ),
    ),
    "invitation": (
        fuzz_invitation,
        (st.one_of(st.just(""), st.text(max_size=600)), st.lists(st.integers(0, 10_000), max_size=3)),
    ),
    "revocation": (
        fuzz_revocation,
        (st.one_of(st.just(""), st.text(max_size=500), _revocation_maps.map(owner_text.encode)), _flips),
    ),
    "state header": (
        fuzz_state_header,
        (_mutated_map(["round", "round_elapsed_s", "step_s", "sha256", "error"]),),
    ),
    "record validator": (
        fuzz_record_validator,
        (
            st.sampled_from(_SLOTS),
            _peer_index,
            _peer_index,
            st.one_of(_peer_index, _raw_or_packed(["peer_id"])),
            st.sampled_from([30.0, -30.0, MAX_TTL_S + 1.0, math.nan, math.inf, -math.inf]),
            st.lists(st.integers(0, 10_000), max_size=2),
        ),
    ),
    "raw DHT record": (
        fuzz_raw_record,
        (
            st.binary(max_size=40),
            st.one_of(st.binary(max_size=200), _packed(_values)),
            st.one_of(
                st.binary(max_size=5000),
                _packed(_packed(_mutated_map(["v", "key", "pk", "sig", "body"]))),
                _packed(st.just(_VALID)),  # signed, for another record than the one it is stored as
            ),
            st.floats(),
        ),
    ),
    "relayed message meta": (
        fuzz_relayed_meta,
        (st.one_of(st.just(b""), st.binary(max_size=600), _packed(_mutated_map(["pk", "sig"]))), _flips),
    ),
    "direct handshake": (
        fuzz_direct_handshake,
        (
            st.one_of(st.just(_HELLO), _hellos, _packed(_mutated_map(["pk", "n", "x", "s"]))),
            st.one_of(st.just(_ANSWER), _packed(_mutated_map(["s"])), st.binary(max_size=600)),
            _flips,
            st.none() | st.binary(max_size=1200),
        ),
    ),
    "direct frames": (
        fuzz_direct_frames,
        (
            st.lists(st.tuples(st.binary(max_size=64), st.binary(max_size=300)), max_size=3),
            st.lists(st.integers(0, 10_000), max_size=2),
            st.none() | st.binary(max_size=600) | _tails,
        ),
    ),
    "relay routing frame": (
        fuzz_relay_route,
        (_relay_routes, st.lists(st.binary(max_size=1100), max_size=4), _tails, st.booleans()),
    ),
    "dial-back request": (
        fuzz_dialback_request,
        (
            st.one_of(
                _packed(st.fixed_dictionaries({"port": st.integers(-10, 70_000) | _values})).map(frame),
                _packed(_mutated_map(["port"])).map(frame),
                st.binary(max_size=300),
                _tails,
            ),
        ),
    ),
    "dial-back answer": (
        fuzz_dialback_answer,
        (
            st.one_of(
                _packed(_mutated_map(["seen", "ip", "port", "error"])).map(frame),
                _packed(_values).map(frame),
                st.binary(max_size=300),
                _tails,
            ),
        ),
    ),
    "record consumers": (
        fuzz_consumers,
        (
            st.lists(_heartbeats(), max_size=8),
            st.integers(min_value=0, max_value=10**6),
            st.floats(min_value=0.0, max_value=4e9, allow_nan=False),
        ),
    ),
    "swarm view": SWARM_VIEW,
    "revocation records": (
        fuzz_revocation_records,
        (
            _published(
                st.lists(_revocation_texts, max_size=revocation.MAX_PER_RECORD + 1)
                | _raw_or_packed(["revoked"])
            ),
        ),
    ),
    "entry checks": (
        fuzz_entry_checks,
        (
            _published(
                st.sampled_from([_OURS.encode(), _THEIRS.encode()]) | _raw_or_packed(["digest", "fields"])
            ),
            _published(st.booleans()),
            _published(
                st.tuples(
                    st.sampled_from(["live", "stopped"]),
                    st.sampled_from([socket.gethostname(), "elsewhere"]),
                    st.integers(0, U64),
                )
            ),
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
