"""Each method's network exchange moves every member to its group's (token-weighted) mean.

Real swarms (bootstrap node, peer processes with their own DHT node and p2p daemon) record each
exchange's contributions and results (`join --record-exchanges`); the mean is recomputed from the
records (`tapped_groups.py`) and compared with each fully merged member's result. A test that
checks too few groups fails: every round (all but at most one) must have a checked group, and
the token-weighted methods must show a group with unequal weights, so that an unweighted merge
cannot pass. The independent arm is the control: its peers send no exchange message at all.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from p2p_trainer.config import OuterConfig, RunConfig
from p2p_trainer.net.exchange_tap import read_counters, read_tapped
from p2p_trainer.processes import wait_all
from tests.conftest import SwarmFactory, rounds_of, tiny_config
from tests.integration.tapped_groups import CheckedGroup, check_swarm

pytestmark = pytest.mark.timeout(240)
H = 3


def recorded_config(method: str, rounds: int, peers: int) -> RunConfig:
    """A tiny run waiting for full groups; constant work (§6) with one micro-batch more than the
    peers can share equally, so one peer's weight differs from the others' in every round."""
    cfg = tiny_config(method, rounds=rounds, h=H, quorum_fraction=1.0)
    # the opt-in direct data plane carries these swarms' messages: the means are checked over it
    cfg = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, data_plane="direct"))
    if method == "data-parallel":  # unweighted by design (§9)
        return cfg
    target = (peers * H + 1) * cfg.data.batch_size * cfg.model.seq_len
    outer = OuterConfig.for_method(method, num_inner_steps=H, target_tokens_per_round=target)
    return dataclasses.replace(cfg, outer=outer)


def run_recorded(
    local_swarm: SwarmFactory, tmp_path: Path, cfg: RunConfig, peers: int, extra: tuple[str, ...] = ()
) -> list[Path]:
    """Run `peers` peers to their end with recording on (`extra`: more join options); their record
    directories."""
    swarm = local_swarm(cfg, peers)
    dirs = [tmp_path / f"peer{i}" / "exchanges" for i in range(peers)]
    try:
        children = [swarm.start_peer(i, ["--record-exchanges", str(d), *extra]) for i, d in enumerate(dirs)]
        assert wait_all(children, timeout_s=180), "peers did not finish their rounds"
        assert [c.proc.returncode for c in children] == [0] * peers
    finally:
        swarm.stop(peer_timeout_s=20, boot_timeout_s=15)
    return dirs


def assert_exchanged(dirs: list[Path]) -> None:
    """Each peer's transport sent and received exchange messages (the contrast to the control), all
    of them over the direct data plane: on loopback every peer can be dialled, and each heartbeat,
    the first included, gives the address."""
    for d in dirs:
        counters = read_counters(d)
        assert counters.messages_sent > 0 and counters.bytes_received > 0, (d, counters)
        assert counters.direct_sent == counters.messages_sent, (d, counters)


MOVED_MIX1_ROUNDS = 1
"""Mix1 averages anchors, which are all equal in round 0 (the seed's) and equal within a pair
whenever the previous round's groups already merged them (with 4 peers and seed 0: in round 1
too), so only some of its checked rounds can show a moving mean; every other exchange averages
values computed from different data."""


def assert_covered(checked: list[CheckedGroup], tag: str, rounds: int) -> None:
    """A checked group in every round of `tag` but at most one, and a moving mean in as many."""
    covered = {c.round for c in checked if c.tag == tag}
    moved = {c.round for c in checked if c.tag == tag and c.moved}
    assert len(covered) >= rounds - 1, f"{tag}: checked groups only in rounds {sorted(covered)} of {rounds}"
    need = MOVED_MIX1_ROUNDS if tag == "mix1" else rounds - 1
    assert len(moved) >= need, f"{tag}: the mean moved a member only in rounds {sorted(moved)}"


@pytest.mark.parametrize(
    ("method", "peers", "tags"),
    [("diloco", 3, ("outer",)), ("noloco", 4, ("noloco",)), ("factored", 4, ("mix1", "mix2"))],
)
def test_outer_exchanges_reach_the_weighted_group_mean(
    local_swarm: SwarmFactory, tmp_path: Path, method: str, peers: int, tags: tuple[str, ...]
) -> None:
    rounds = 4
    dirs = run_recorded(local_swarm, tmp_path, recorded_config(method, rounds, peers), peers)
    assert_exchanged(dirs)
    checked = check_swarm(dirs)
    for tag in tags:
        assert_covered(checked, tag, rounds)
    # the contributions' weights are the tokens behind them (§5): unequal under the uneven shares
    weighted_tag = "mix2" if method == "factored" else tags[0]
    assert any(c.weighted for c in checked if c.tag == weighted_tag), f"{weighted_tag}: all weights equal"
    if peers > 3:  # groups of 2 out of 4: partitions, not one all-peer group
        assert any(len(c.weights) < peers for c in checked), "no group smaller than the swarm"


def test_data_parallel_gradients_reach_the_mean_every_step(local_swarm: SwarmFactory, tmp_path: Path) -> None:
    rounds = 2
    dirs = run_recorded(local_swarm, tmp_path, recorded_config("data-parallel", rounds, 3), 3)
    assert_exchanged(dirs)
    checked = check_swarm(dirs)
    assert_covered(checked, "grad", rounds * H)  # one exchange per inner step
    assert all(c.weights == (1.0,) * 3 for c in checked if c.tag == "grad")


def test_independent_peers_send_no_exchange_traffic(local_swarm: SwarmFactory, tmp_path: Path) -> None:
    # Stopped by time, not rounds: a tiny independent round takes ~0.1 s, so a few rounds would be
    # over before the other peers' heartbeats show, and then "sent nothing" proves nothing.
    peers = 3
    cfg = recorded_config("independent", 100_000, peers)
    dirs = run_recorded(local_swarm, tmp_path, cfg, peers, ("--minutes", "0.15"))
    for i, d in enumerate(dirs):
        records = rounds_of(tmp_path, i)
        assert len(records) >= 10, f"peer{i} trained {len(records)} rounds"
        # it counted every peer while it sized its share: it was in the swarm with them
        assert max(r.live_peers for r in records) == peers, [r.live_peers for r in records]
        assert read_tapped(d) == [], f"peer{i} took part in an exchange"
        counters = read_counters(d)
        assert (counters.messages_sent, counters.bytes_sent) == (0, 0), counters
        assert (counters.messages_received, counters.bytes_received) == (0, 0), counters
        assert all(r.exchanges == () and r.bytes_sent == r.bytes_received == 0 for r in records)
