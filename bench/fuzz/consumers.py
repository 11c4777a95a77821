"""Targets for the consumers of decoded records: view bounds and round alignment over heartbeats,
published revocations, and a joiner's entry checks over DHT records sealed by the right key or not."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import strategies as st

from bench.fuzz.decoders import _CLOSED_SWARM, _REVOCATIONS, _REVOKED
from bench.fuzz.fakes import DictDHT, _store
from bench.fuzz.inputs import _PEERS, _changed_chars, _flips, _peer_index
from p2p_trainer.net import records, revocation
from p2p_trainer.net.admission import Admission, learn_published
from p2p_trainer.net.align import steps_late
from p2p_trainer.net.dht import left_by_dead_process
from p2p_trainer.net.donor_check import round_refusal
from p2p_trainer.net.state_sync import donor_order
from p2p_trainer.net.view_bounds import HeartbeatBounds, ReplayFilter, bound_heartbeats, median_round
from p2p_trainer.run.entry_paths import estimated_round, rejoin_target


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


Published = tuple[int, int, list[int], Any]
"""(owner, sealer, flips, what): a record stored under `_PEERS[owner]`'s name, sealed by
`_PEERS[sealer]`'s key, with `flips` bits flipped in the stored value."""


def fuzz_revocation_records(published: list[Published]) -> None:
    """Revocation records in the DHT, read by a peer of the closed swarm: only the owner's own
    revocation keeps a peer out, and it does once a record sealed by its publisher carries it."""
    dht, key = DictDHT(), revocation.revocations_key("fuzz")
    carried = {}
    for owner, sealer, flips, texts in published:
        body = records.pack({"revoked": texts}) if isinstance(texts, list) else texts
        honest = _store(dht, key, owner, sealer, body, flips)
        fits = isinstance(texts, list) and len(texts) <= revocation.MAX_PER_RECORD
        fits = fits and all(len(t) <= revocation.MAX_REVOCATION_CHARS for t in texts)
        carried[owner] = honest and fits and _REVOKED.encode() in texts
    admission = Admission(_CLOSED_SWARM, "fuzz")
    learn_published(admission, dht, "fuzz")
    revoked = {p.peer_id for p in _PEERS if admission.revoked_by(p.peer_id) is not None}
    assert revoked <= {_REVOKED.peer_id}, revoked
    assert revoked or not any(carried.values()), carried


_RUN = "fuzz"
_OURS = records.RunDefinition({"method": "factored", "seed": 0})
_THEIRS = records.RunDefinition({"method": "diloco", "seed": 0})


def _definition(body: bytes) -> records.RunDefinition | None:
    with contextlib.suppress(records.RecordError):
        return records.RunDefinition.decode(body)
    return None


def fuzz_entry_checks(
    definitions: list[Published], beats: list[Published], identities: list[Published]
) -> None:
    """A joiner's checks on entry, over run definitions, heartbeats and liveness records: it is
    refused (the run's definition differs, its identity is live) exactly when records validly
    signed by their owners say so."""
    dht = DictDHT()
    defined: dict[int, records.RunDefinition | None] = {}
    beating: dict[int, bool] = {}
    claimed: dict[int, str | None] = {}
    for owner, sealer, flips, body in definitions:
        honest = _store(dht, records.run_definition_key(_RUN), owner, sealer, body, flips)
        defined[owner] = _definition(body) if honest else None
    for owner, sealer, flips, leaving in beats:
        beat = records.Heartbeat(_PEERS[owner].peer_id, 1, 0, None, 0.0, "0.1.0", records.now(), leaving)
        honest = _store(dht, records.heartbeat_key(_RUN), owner, sealer, beat.encode(), flips)
        beating[owner] = honest and not leaving
    for owner, sealer, flips, (state, host, pid) in identities:
        record = records.Liveness(_PEERS[owner].peer_id, "other", state, host, pid)
        key = records.liveness_key(_PEERS[owner].peer_id)
        claimed[owner] = (
            state if _store(dht, key, owner, sealer, record.encode(), flips, subkey=False) else None
        )
    live = {p for p in defined if beating.get(p) or claimed.get(p) == "live"} - {0}
    digests = {d.digest for p in live if (d := defined[p]) is not None}
    try:
        records.check_run_definition(dht, _RUN, _OURS, 600.0, _PEERS[0])
        refused = False
    except records.RunDefinitionMismatch:
        refused = True
    assert refused == (bool(digests - {_OURS.digest}) and _OURS.digest not in digests), (refused, digests)
    found = records.find_liveness(dht, _PEERS[0].peer_id)
    assert (None if found is None else found.state) == claimed.get(0), (found, claimed.get(0))
    if found is not None:
        assert isinstance(left_by_dead_process(found), bool)


def _published(what: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Published]]:
    return st.lists(st.tuples(_peer_index, _peer_index, _flips, what), max_size=4)


_revocation_texts = st.one_of(
    st.sampled_from(_REVOCATIONS),
    st.tuples(st.sampled_from(_REVOCATIONS), _flips).map(lambda t: _changed_chars(*t)),
    st.text(max_size=revocation.MAX_REVOCATION_CHARS + 20),
)
