"""A real swarm: bootstrap node and peer processes with their own DHT node and p2p daemon."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from p2p_trainer.processes import group_gone, wait_all
from p2p_trainer.run.launcher import JoinArgs, join_argv
from p2p_trainer.train.checkpoint import read_anchor
from tests.conftest import SwarmFactory, final_of, held_sockets, remaining, rounds_of, tiny_config, wait_until

pytestmark = pytest.mark.timeout(300)
ROUNDS = 6


@pytest.mark.parametrize("method", ["diloco"])
def test_blocking_all_peer_rounds_make_members_equal(
    local_swarm: SwarmFactory, tmp_path: Path, method: str
) -> None:
    # full quorum: exact equality of the members needs every contribution in every round (§4)
    swarm = local_swarm(tiny_config(method, rounds=ROUNDS, quorum_fraction=1.0), 3)
    assert swarm.boot is not None
    children = [swarm.boot]
    try:
        children += [swarm.start_peer(i) for i in range(3)]
        assert wait_until(lambda: len(rounds_of(tmp_path, 0)) >= 1, 180)
        held = held_sockets([c.pid for c in children])
        assert wait_all(children[1:], timeout_s=240), "peers did not finish their rounds"
        assert all(c.proc.returncode == 0 for c in children[1:])
    finally:
        swarm.stop(peer_timeout_s=20, boot_timeout_s=20)
    for i in range(3):
        rounds = rounds_of(tmp_path, i)
        assert len(rounds) == ROUNDS
        assert rounds[-1].train_loss < rounds[0].train_loss
        assert all(e.ok and e.group_size == 3 for r in rounds for e in r.exchanges)
        assert all(r.bytes_sent > 0 for r in rounds)
    anchors = [read_anchor(tmp_path / f"peer{i}" / "checkpoint.safetensors") for i in range(3)]
    for other in anchors[1:]:
        for a, b in zip(anchors[0], other, strict=True):
            torch.testing.assert_close(a, b)
    for c in children:
        assert group_gone(c.pid), f"{c.name}'s processes survived"
    assert held and not remaining(held), f"left socket files: {remaining(held)}"


def test_late_joiner_downloads_state_and_catches_up(local_swarm: SwarmFactory, tmp_path: Path) -> None:
    # Stopped by time, not rounds: tiny rounds take ~0.1 s on an idle machine, so a fixed round count
    # can be over before the late joiner's node is up.
    swarm = local_swarm(tiny_config("factored", rounds=100_000), 3)
    assert swarm.boot is not None
    children = [swarm.boot]
    try:
        # Each peer's time limit counts from its own join. The others' limit leaves the late peer,
        # which joins after the swarm's fourth round plus its own start-up and state download (up
        # to ~25 s on a loaded 2-core machine), time to finish while they still train, so its last
        # rounds are not judged against peers that have already left.
        limit = ["--minutes", "1.25"]
        children += [swarm.start_peer(i, limit) for i in range(3)]
        assert wait_until(lambda: len(rounds_of(tmp_path, 0)) >= 4, 180), "the swarm did not get going"
        late_limit = ["--minutes", "0.5", "--wait-for-peers", "1"]  # ends before the others do
        children.append(swarm.start_peer(3, late_limit))
        assert wait_until(lambda: len(rounds_of(tmp_path, 3)) >= 1, 180)
        held = held_sockets([c.pid for c in children])
        assert wait_all(children[1:], timeout_s=240)
        assert all(c.proc.returncode == 0 for c in children[1:])
    finally:
        swarm.stop(peer_timeout_s=20, boot_timeout_s=20)
    late = rounds_of(tmp_path, 3)
    assert late and late[0].round >= 4, "the late peer did not adopt the swarm's round"
    # It caught up with the round in progress and then mixes with the others. Its first rounds may
    # fail whatever the window: the others do not wait for it until its heartbeat reaches their
    # views, a few seconds that are many tiny rounds on a fast machine and few on a slow one. From
    # its first merge on, its Mix1/Mix2 exchanges merge in most rounds.
    merged = [any(e.ok and e.group_size >= 2 for e in r.exchanges) for r in late]
    assert True in merged, f"the late peer never merged in {len(merged)} rounds"
    after = merged[merged.index(True) :]
    assert len(after) >= 3 and sum(after) >= 0.75 * len(after), (
        f"merged in {sum(after)} of {len(after)} rounds"
    )
    # It enters in step (net/entry.py): the round it enters from is named ahead in its heartbeat, so
    # every view counts it from that round on, and it downloads the state again as that round
    # begins, timed by a donor (`await_state_round`), so its first rounds meet their groups (5 of 5
    # in three runs). Without the entry round, views disagreed for many rounds while its heartbeat
    # spread; timed by heartbeats, it came up to 2 rounds late: 1 of its first 5 in one run.
    assert sum(merged[:5]) >= 3, f"merged in {sum(merged[:5])} of its first 5 rounds"
    # It leaves in step too: its time bound named its last round ahead, so the others' groups
    # leave it out from then on, and their exchanges meet whole while it waits for the final
    # agreement (in one run every one of theirs, about 1,000 each; without that, 32 of 80).
    stopped_at = late[-1].unix_time
    since = [
        e for i in range(3) for r in rounds_of(tmp_path, i) if r.unix_time > stopped_at for e in r.exchanges
    ]
    whole = sum(e.ok and not e.left_out and not e.own_parts and not e.late_parts for e in since)
    assert since and whole >= 0.75 * len(since), f"after the late peer stopped: {whole} of {len(since)} whole"
    finals = [final_of(tmp_path, i) for i in range(4)]
    assert all(f is not None for f in finals)
    losses = [f.val_loss for f in finals if f is not None and f.val_loss is not None]
    assert len(losses) == 4, finals  # every final record carries the evaluated loss
    # It ends on the final agreement's mean, better than its own model, near the others: they
    # train on at full speed after it stops (its leave is named ahead), and its older model counts
    # little in that mean (run/final_agreement.py `final_weight`).
    late_final = finals[3]
    assert late_final is not None and late_final.agreement is not None, late_final
    assert late_final.agreement.group_size == 4 and not late_final.kept_own, late_final
    assert late_final.own_val_loss is not None and losses[3] < late_final.own_val_loss, late_final
    assert abs(losses[3] - sum(losses[:3]) / 3) < 0.1, losses
    for c in children:
        assert group_gone(c.pid)
    assert held and not remaining(held)


def test_same_identity_twice_is_refused_and_sigint_stops_cleanly(
    local_swarm: SwarmFactory, tmp_path: Path
) -> None:
    swarm = local_swarm(tiny_config("factored", rounds=100_000), 1)
    assert swarm.boot is not None
    opts, initial, children = swarm.opts, swarm.initial_peers, [swarm.boot]
    try:
        children.append(swarm.start_peer(0))
        assert wait_until(lambda: len(rounds_of(tmp_path, 0)) >= 1, 180), "peer0 did not start training"
        held = held_sockets([c.pid for c in children])
        # peer0's own key, for a second peer with its own run directory
        twin = JoinArgs(opts.config_path, identity=tmp_path / "keys" / "peer0.key", run_dir=tmp_path / "dup")
        dup = subprocess.run(join_argv(twin, initial), capture_output=True, text=True, timeout=120)
        assert dup.returncode != 0 and "already used" in dup.stderr, dup.stderr[-2000:]
        assert children[1].alive(), "the original must keep running"
        assert children[1].stop(timeout_s=60) == 130  # SIGINT: checkpoint, final record, exit 130
    finally:
        swarm.stop(peer_timeout_s=20, boot_timeout_s=20)
    final = final_of(tmp_path, 0)
    assert final is not None and final.stopped is True
    assert (tmp_path / "peer0" / "checkpoint.safetensors").exists()
    for c in children:
        assert group_gone(c.pid)
    assert held and not remaining(held)
