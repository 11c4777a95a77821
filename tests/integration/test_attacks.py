"""Attacks by one hostile node, built from our own code, on three honest peers (real processes).

Each attack runs twice. With the defences on (`[security] defences = true`, the default), the
honest peers must finish every round (exit 0, no hang) with a final validation loss within 3% of
a clean run of the same length (three honest peers, no attacker; one run for the module). With
the defences off, the same attack must measurably hurt them, which shows the attack is real.
To keep `make test` short it runs nine defended arms (`IN_MAKE_TEST`); every other arm is a bench
(`make bench-check`). Every arm prints its
measurements (run with `-s`); docs/security-results.md has the table.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from p2p_trainer.config import RunConfig
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.lab.adversary.arena import Outcome, run_attack
from p2p_trainer.lab.adversary.attacks import parse_attack
from p2p_trainer.lab.adversary.streams import CLAIMED_BYTES
from p2p_trainer.net.identity import load_or_create_identity
from p2p_trainer.net.stream_gate import MAX_PENDING
from p2p_trainer.run.join import payload_limit
from p2p_trainer.train.model import build_model
from tests.conftest import tiny_config

pytestmark = pytest.mark.timeout(300)
ROUNDS = 30
H = 5
LONG_ROUNDS = 120
THROUGH_THE_VIEW = {"impersonate", "replay"}
VIEW_ROUNDS = 480
"""Attacks that make honest peers look like joiners (round 0), and their rounds. A peer leaves
joiners out only once it has trained for three heartbeat periods (6 s), so these arms, defended
and not, run long against a clean run of that length: long enough that the attack acts through
most of the run and the undefended arm shows the harm the defended one must not. At 120 rounds
(12-15 s on the idle machine of 7 Dec 2026, night) it acted through half of it, and the
undefended arm merged in 0.75-0.89 of its rounds, at this commit and at 7c754ea alike."""
SPLIT = 0.7
"""Undefended, an attack splits the swarm if fewer than this share of the clean run's rounds merge."""
TOLERANCE = 1.03
"""Defended: each honest peer's final validation loss is at most this times the clean run's mean."""
BOUNDED_WAITS = {"quorum_wait_max_s": 4.0, "grace_max_s": 2.0, "grace_min_s": 1.0, "mix1_grace_s": 2.0}
"""As in the resilience tests: a member that never contributes costs a few seconds, not 30."""

CONTRIBUTIONS = ["scale:1e3", "scale:1e6", "flip:10", "nan", "weight", "owner:10"]
RECORDS = ["impersonate", "huge-round", "far-round-start", "replay", "replay-leave", "tombstone", "flood:100"]
STREAMS = 200
"""Endless streams the attacker holds open to each honest peer."""
STREAM_FDS_ALLOWED = MAX_PENDING + SecurityConfig().sender_open_streams + 8
"""Defended: descriptors an honest peer may hold above the clean run's peak under endless streams:
the gate's pending accepts, the attacker's bound, and the few that clean runs' peaks vary by."""
RSS_SLACK_MIB = 64.0
"""What an honest peer's peak resident memory may differ by between two runs of the same length
with nothing held for an attacker (allocator and torch caches, the round a snapshot lands in)."""
RESTART_ROUNDS = 400
"""`replay-leave`'s arms: the arena stops one honest peer at a twentieth of the rounds and starts it
again, which takes it 10-30 s; the others must still be training when it is back (tiny rounds
take about 0.15 s)."""
LATE_DONOR = "donor-late:60"
"""A donor serving the seed's weights 60 rounds ahead of the swarm's latest round, advertised once
the swarm trains, against a peer that joins it at round LATE_ROUND: its round is plausible (within
the window above the median) and a joiner starts from the seed too, so its loss check passes them;
only a second donor's state, the swarm's, refuses them."""
LATE_ROUNDS = 300
LATE_H = 20
"""The late-join arms' rounds and inner steps. A joiner takes 10-20 s to start. The round window
(100 rounds) and the heartbeats' lag (up to two view periods: the joiner counts donors within
that many rounds of the latest as fresh, in a random order) are counted in rounds, so rounds
four times longer than the others' keep the lead ahead of every honest donor and inside the
window (in a run of 7 Dec 2026 the joiner's heartbeats lagged the donors' states by 17 rounds),
and the swarm far from its end when the joiner arrives (round 25-45 of 300)."""
LONG_ARMS = THROUGH_THE_VIEW | {f"streams:{STREAMS}", "replay-leave", LATE_DONOR}
"""Arms that run more than ROUNDS: the view attacks and the late donor (above), the returning
peer's, and the endless streams, which the attacker opens only once it has found the honest
peers, a few seconds before thirty tiny rounds end (LONG_ROUNDS)."""
SPAM = "spam:32"
"""A member that sends, with each exchange message, 32 complete messages of the largest size a
peer takes, under keys no exchange reads."""
LONE_DONOR = "donor:5"
"""A poisoned donor at a round the run could be at, first in the swarm: each honest peer, starting,
sees it as the only donor (nothing to measure its round against, no second donor to confirm)."""
MOMENTUM_DONOR = "donor-momentum:1"
"""The same lone donor serving the seed's weights (each starting peer's own, so no check of the
weights can refuse them) at round 1, with an outer momentum of 1000x those weights: only the rule
that a joiner takes no momentum a second donor does not back stands in its way."""
OTHERS = ["donor", LONE_DONOR, MOMENTUM_DONOR, LATE_DONOR, f"streams:{STREAMS}", SPAM]
ATTACKS = CONTRIBUTIONS + RECORDS + OTHERS

IN_MAKE_TEST = [
    "flip:10",
    "owner:10",
    "impersonate",
    "huge-round",
    "donor",
    LONE_DONOR,
    MOMENTUM_DONOR,
    "flood:100",
    f"streams:{STREAMS}",
    SPAM,
]
"""The defended arms `make test` runs: a contribution, a part owner's result, a forged record, a
forged round, a poisoned donor, far ahead and alone in sight, its poisoned momentum, a flood of phantom peers in an
open swarm, endless streams, and a member's flood of messages nobody reads (under a minute each;
`impersonate` runs VIEW_ROUNDS and the streams LONG_ROUNDS, each with one clean run of that
length). The other defended arms, and every undefended one, run under `make bench-check`."""
LONG_TIMEOUT = pytest.mark.timeout(720)
"""For a long arm: its own run and, the first time, the clean run of that length."""


def _timeout_s(rounds: int) -> float:
    """How long the honest peers may take: 180 s for ROUNDS, more for longer runs."""
    return 180.0 * max(1.0, rounds / ROUNDS) ** 0.5


def _arm(name: str, bench: bool) -> Any:
    marks = [pytest.mark.bench] if bench else []
    if name == LATE_DONOR:  # its own run and its clean run may each take the arena's whole wait
        marks.append(pytest.mark.timeout(2 * _timeout_s(LATE_ROUNDS) + 60))
    elif name in LONG_ARMS:
        marks.append(LONG_TIMEOUT)
    return pytest.param(name, marks=marks)


DEFENDED = [_arm(name, bench=name not in IN_MAKE_TEST) for name in ATTACKS]

ACTED = {"peer": "adversary: tampered", "records": "forged records", "donor": "ready", "streams": "holding"}
"""A line the attacker logs once it has made its attack."""


def _rounds(name: str) -> int:
    if name == "replay-leave":
        return RESTART_ROUNDS
    if name == LATE_DONOR:
        return LATE_ROUNDS
    if name in THROUGH_THE_VIEW:
        return VIEW_ROUNDS
    return LONG_ROUNDS if name in LONG_ARMS else ROUNDS


def _h(name: str) -> int:
    return LATE_H if name == LATE_DONOR else H


def _config(defences: bool, rounds: int = ROUNDS, h: int = H) -> RunConfig:
    cfg = tiny_config("factored", rounds=rounds, h=h, **BOUNDED_WAITS)
    return dataclasses.replace(cfg, security=SecurityConfig(defences=defences))


def _clean_run(
    tmp_path_factory: pytest.TempPathFactory, rounds: int, restart: bool = False, late: bool = False
) -> Outcome:
    out = run_attack(
        tmp_path_factory.mktemp("clean"),
        _config(True, rounds, LATE_H if late else H),
        None,
        timeout_s=_timeout_s(rounds),
        restart=restart,
        late=late,
    )
    print(f"\n{out.row(out.mean_loss)}")
    assert out.finished and out.final_rounds == [rounds] * 3, out.row(out.mean_loss)
    assert math.isfinite(out.mean_loss)
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _clean_run(tmp_path_factory, ROUNDS)


@pytest.fixture(scope="module")
def clean_long(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _clean_run(tmp_path_factory, LONG_ROUNDS)


@pytest.fixture(scope="module")
def clean_view(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _clean_run(tmp_path_factory, VIEW_ROUNDS)


@pytest.fixture(scope="module")
def clean_restart(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """The control of `replay-leave`: the same peer leaves and comes back, and nobody attacks."""
    return _clean_run(tmp_path_factory, RESTART_ROUNDS, restart=True)


@pytest.fixture(scope="module")
def clean_late(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """The control of `LATE_DONOR`: the same peer joins late, and nobody attacks."""
    return _clean_run(tmp_path_factory, LATE_ROUNDS, late=True)


def _baseline(name: str, request: pytest.FixtureRequest) -> Outcome:
    """The clean run of the same length as `name`'s arms (each is run only if an arm needs it)."""
    if name == LATE_DONOR:
        late: Outcome = request.getfixturevalue("clean_late")
        return late
    fixtures = {
        ROUNDS: "clean",
        LONG_ROUNDS: "clean_long",
        RESTART_ROUNDS: "clean_restart",
        VIEW_ROUNDS: "clean_view",
    }
    fixture = fixtures[_rounds(name)]
    out: Outcome = request.getfixturevalue(fixture)
    return out


def _attacked(tmp_path: Path, name: str, defences: bool, clean: Outcome) -> Outcome:
    attack = parse_attack(name)
    rounds = _rounds(name)
    cfg = _config(defences, rounds, _h(name))
    out = run_attack(tmp_path, cfg, attack, timeout_s=_timeout_s(rounds))
    print(f"\n[defences {'on' if defences else 'off'}] {out.row(clean.mean_loss)}")
    assert ACTED[attack.kind] in out.attacker_log, f"the attacker never acted:\n{out.attacker_log[-2000:]}"
    if attack.kind == "records":  # it logs its counts from the start, 0 until it has something to store
        assert re.search(r"of [1-9][0-9]* forged records", out.attacker_log), out.attacker_log[-2000:]
    return out


@pytest.mark.parametrize("name", DEFENDED)
def test_defended_swarm_trains_on(tmp_path: Path, name: str, request: pytest.FixtureRequest) -> None:
    clean = _baseline(name, request)
    out = _attacked(tmp_path, name, True, clean)
    assert out.finished, f"an honest peer crashed or hung: {out.row(clean.mean_loss)}"
    assert out.final_rounds == [_rounds(name)] * 3, (
        f"an honest peer stopped early: {out.row(clean.mean_loss)}"
    )
    bound = TOLERANCE * clean.mean_loss
    for i, loss in enumerate(out.val_losses):
        assert loss is not None and loss <= bound, (
            f"peer{i}: loss {loss} > {bound:.4g}: {out.row(clean.mean_loss)}"
        )
    if name.startswith("streams"):
        allowed = STREAM_FDS_ALLOWED
        extra = out.fd_peak - clean.fd_peak
        assert extra <= allowed, f"an honest peer held {extra} descriptors more than in the clean run"
        # each stream it holds could at most have its whole announced payload buffered; these
        # streams send 64 bytes of it, so this catches memory reserved for what a sender announces
        # (undefended peers reserve none either: 387 MiB against a clean 386 on 6 Dec 2026)
        memory_mib = allowed * CLAIMED_BYTES / 2**20 + RSS_SLACK_MIB
        grew = out.rss_peak_mib - clean.rss_peak_mib
        assert grew <= memory_mib, f"an honest peer's memory peaked {grew:.0f} MiB above the clean run's"
    if name == LATE_DONOR:  # refused for disagreeing with a second donor, not for its round or loss
        joiner = (tmp_path / "peer2" / "log.txt").read_text(errors="replace")
        refused = rf"donor {_attacker_id(tmp_path)[-8:]}: its round-\d+ state disagrees with"
        assert re.search(refused, joiner), joiner[-3000:]
    if name == "replay-leave":  # the returning peer merges again, as in the clean run
        assert not _left_alone(out, clean), (
            f"the peer that came back was left alone: {out.row(clean.mean_loss)}"
        )
    if name == SPAM:
        grew = out.rss_peak_mib - clean.rss_peak_mib
        assert grew <= _spam_memory_mib(), (
            f"an honest peer's memory peaked {grew:.0f} MiB above the clean run's"
        )
    if name.startswith("flood"):  # phantoms answer no probe, so no view draws them into a group
        assert min(out.merged_share) >= 0.8 * min(clean.merged_share), (out.merged_share, clean.merged_share)


def _spam_memory_mib() -> float:
    """What a defended peer may hold above a clean run for one member's messages nobody reads:
    its mailbox quota (`[security] sender_mailbox_payloads` of the largest message a peer takes,
    `payload_limit`), and what clean runs' peaks vary by."""
    n_floats = sum(p.numel() for p in build_model(_config(True).model, seed=0).parameters())
    quota_bytes = SecurityConfig().sender_mailbox_payloads * payload_limit(n_floats)
    return quota_bytes / 2**20 + RSS_SLACK_MIB


def _swollen(out: Outcome, clean: Outcome) -> bool:
    """An honest peer's memory peaked above what the defended arm may hold."""
    return out.rss_peak_mib - clean.rss_peak_mib > _spam_memory_mib()


def _worse_loss(out: Outcome, clean: Outcome) -> bool:
    """Crashed, hung, or a mean final loss more than the defended tolerance above the clean run's."""
    return not out.finished or out.mean_loss > TOLERANCE * clean.mean_loss


def _split(out: Outcome, clean: Outcome) -> bool:
    """The honest peers stopped averaging: far fewer rounds merged in full than in the clean run.

    A few dozen rounds of a tiny model are too few for the swarm's gain over lone training to show
    in the loss, so attacks that split the swarm are judged by the merges they cost."""
    share = sum(out.merged_share) / len(out.merged_share)
    return _worse_loss(out, clean) or share < SPLIT * sum(clean.merged_share) / len(clean.merged_share)


def _left_alone(out: Outcome, clean: Outcome) -> bool:
    """One honest peer stopped averaging: far fewer of its rounds merged in full than the clean
    run's fewest (the peer that left and came back, which the others evict as gone)."""
    return _worse_loss(out, clean) or min(out.merged_share) < SPLIT * min(clean.merged_share)


def _skipped(out: Outcome, clean: Outcome) -> bool:
    """Aligned peers left out inner steps they should have run (the clean run leaves out none)."""
    steps = ROUNDS * H * len(out.skipped_steps)
    return _worse_loss(out, clean) or sum(out.skipped_steps) - sum(clean.skipped_steps) > 0.05 * steps


def _held(out: Outcome, clean: Outcome) -> bool:
    """An honest peer held open more descriptors than the defended arm may (70-136 above the clean
    run's peak in the undefended runs of 6 Dec 2026, against 11-14 defended)."""
    return out.fd_peak - clean.fd_peak > STREAM_FDS_ALLOWED


Harm = Callable[[Outcome, Outcome], bool]
HARM: dict[str, Harm] = {
    **{name: _worse_loss for name in CONTRIBUTIONS},
    # NaN is dropped by the finiteness check, which stays on with the defences off: the merges
    # with the hostile peer are what it costs
    "nan": _split,
    **{name: _split for name in ("impersonate", "replay", "tombstone", "flood:100")},
    "replay-leave": _left_alone,
    "far-round-start": _skipped,
    "huge-round": _worse_loss,
    "donor": _worse_loss,
    LONE_DONOR: _worse_loss,
    MOMENTUM_DONOR: _worse_loss,
    f"streams:{STREAMS}": _held,
    SPAM: _swollen,
}


SHOWN_IN_THE_LOG = {LATE_DONOR: ("peer2", r"late join: adopted round \d+ from {attacker}")}
"""Attacks whose harm the swarm heals before the end, so the final loss cannot show it: what the
victim's log says instead (a pattern; `{attacker}`: the end of the attacker's peer id, as logs
print it). Undefended, the late joiner adopts the seed rounds ahead of the swarm, merges in almost
none of its rounds, and once alone long enough it rejoins the swarm by download; its final loss
was within 0.1% of the control's (7 Dec 2026)."""


def _attacker_id(run_dir: Path) -> str:
    """The peer id of a run's donor attacker (its key is in the run's key folder, or the arena
    would have raised: the attacker did not start)."""
    path = run_dir / "keys" / "attacker.key"
    assert path.exists(), f"no attacker key at {path}"
    return load_or_create_identity(path).peer_id


HARMLESS_UNDEFENDED = {"replay"}
"""Attacks that the view resists with the defences off: a replayed heartbeat keeps the time it
was first published, and only a round-0 heartbeat from the last two heartbeat periods marks a peer
as joining (`SwarmView._joining`), so honest peers' first heartbeats, stored again, leave nobody
out."""


@pytest.mark.bench
@pytest.mark.parametrize("name", [_arm(name, bench=True) for name in ATTACKS])
def test_undefended_swarm_is_hurt(tmp_path: Path, name: str, request: pytest.FixtureRequest) -> None:
    clean = _baseline(name, request)
    out = _attacked(tmp_path, name, False, clean)
    if name in SHOWN_IN_THE_LOG:
        peer, says = SHOWN_IN_THE_LOG[name]
        log = (tmp_path / peer / "log.txt").read_text(errors="replace")
        took = re.search(says.format(attacker=_attacker_id(tmp_path)[-8:]), log)
        assert took, f"the attack did not take: {out.row(clean.mean_loss)}\n{log[-3000:]}"
        return
    if name in HARMLESS_UNDEFENDED:
        assert not HARM[name](out, clean), f"the view no longer resists it: {out.row(clean.mean_loss)}"
        return
    assert HARM[name](out, clean), f"the attack did no measurable harm: {out.row(clean.mean_loss)}"


@pytest.mark.bench
def test_a_closed_swarm_is_not_split_by_a_flood_of_fake_peers(tmp_path: Path, clean: Outcome) -> None:
    """In an open swarm 100 validly signed phantom heartbeats leave the honest peers merging in
    almost no round (their groups wait on phantoms); an allow-list admits none of them."""
    honest = [load_or_create_identity(tmp_path / "keys" / f"peer{i}.key").peer_id for i in range(3)]
    cfg = _config(True)
    closed = dataclasses.replace(cfg.security, admission="allow-list", allow=tuple(honest))
    out = run_attack(tmp_path, dataclasses.replace(cfg, security=closed), parse_attack("flood:100"))
    print(f"\n[allow-list] {out.row(clean.mean_loss)}")
    assert ACTED["records"] in out.attacker_log, f"the attacker never acted:\n{out.attacker_log[-2000:]}"
    assert out.finished and out.final_rounds == [ROUNDS] * 3, out.row(clean.mean_loss)
    assert all(loss is not None and loss <= TOLERANCE * clean.mean_loss for loss in out.val_losses)
    # as often as in the clean run, less the slack of a loaded machine
    assert min(out.merged_share) >= 0.8 * min(clean.merged_share), (out.merged_share, clean.merged_share)


DRIFT = "drift:5"
"""A liar within the bounds where the reference is zero: each contribution one fixed direction, at
5 times its own norm (the update ratio's bound is 6; a random direction passes the cosine floor)."""


def _diloco_together(robust_mean: str) -> RunConfig:
    """DiLoCo with all four peers (three honest, the liar) in one group: every exchange is a Δ."""
    cfg = tiny_config("diloco", rounds=ROUNDS, h=H, **BOUNDED_WAITS)
    outer = dataclasses.replace(cfg.outer, group_size=0)
    return dataclasses.replace(cfg, outer=outer, security=SecurityConfig(robust_mean=robust_mean))  # type: ignore[arg-type]


@pytest.mark.bench
@pytest.mark.timeout(600)
def test_a_liar_within_the_bounds_in_one_group(tmp_path: Path) -> None:
    """`DRIFT` in DiLoCo with all four peers in one group, merged by the plain mean and by a
    trimmed mean (docs/algorithms.md §10). Every honest peer must train to the end with a finite
    loss; what each rule costs is printed for docs/security-results.md, not bounded here: over
    thirty rounds of the tiny model both stayed within 1.5% of the clean run."""
    clean = run_attack(tmp_path / "clean", _diloco_together("mean"), None, timeout_s=_timeout_s(ROUNDS))
    print(f"\n[diloco, one group] {clean.row(clean.mean_loss)}")
    assert clean.finished and math.isfinite(clean.mean_loss), clean.row(clean.mean_loss)
    attack = parse_attack(DRIFT)
    for rule in ("mean", "trimmed"):
        out = run_attack(tmp_path / rule, _diloco_together(rule), attack, timeout_s=_timeout_s(ROUNDS))
        print(f"[robust_mean = {rule}] {out.row(clean.mean_loss)}")
        assert ACTED["peer"] in out.attacker_log, f"the attacker never acted:\n{out.attacker_log[-2000:]}"
        assert out.finished and out.final_rounds == [ROUNDS] * 3, out.row(clean.mean_loss)
        assert all(v is not None and math.isfinite(v) for v in out.val_losses), out.row(clean.mean_loss)


@pytest.mark.bench
def test_a_liar_within_the_bounds_in_pairs(tmp_path: Path, clean: Outcome) -> None:
    """What bounding buys in pairs, the default (SECURITY.md): a pair cannot outvote `DRIFT`. The
    honest peers must train to the end; the loss it costs them is printed for
    docs/security-results.md, not bounded here."""
    out = _attacked(tmp_path, DRIFT, True, clean)
    assert out.finished and out.final_rounds == [ROUNDS] * 3, out.row(clean.mean_loss)
    assert all(v is not None and math.isfinite(v) for v in out.val_losses), out.row(clean.mean_loss)
