"""A peer alone for rounds rejoins the swarm's round by download, judged by what donors serve."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from p2p_trainer.exchange.interface import Failed
from p2p_trainer.net import records
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.run import entry_paths
from p2p_trainer.run.entry_paths import Rejoin
from tests.conftest import tiny_config

pytestmark = pytest.mark.timeout(30)

TOKENS_PER_ROUND = 640
LAG = 3


class _View:
    period_s = 2.0

    def __init__(self, beats: list[Heartbeat]) -> None:
        self.beats = beats
        self.status = SimpleNamespace(enters_round=0)

    def heartbeats(self) -> list[Heartbeat]:
        return self.beats


def _alone(rnd: int) -> Any:
    """A round whose one exchange merged with nobody."""
    return SimpleNamespace(
        round=rnd, report=SimpleNamespace(exchanges=[SimpleNamespace(merged=False, late_parts=0)])
    )


def _rejoin(own_round: int, beats: list[Heartbeat]) -> Rejoin:
    cfg = tiny_config("diloco", rounds=1000)
    peer = SimpleNamespace(cfg=cfg, state=SimpleNamespace(round=own_round, anchor=[]), val=None)
    transport = SimpleNamespace(peer_id="me")
    return Rejoin(
        cast(Any, peer), cast(Any, _View(beats)), cast(Any, transport), "run", LAG, TOKENS_PER_ROUND
    )


def _beat(peer: str, rnd: int, age_s: float, tokens_per_s: float) -> Heartbeat:
    """A heartbeat `age_s` old whose throughput extrapolates its round by `age_s * tokens_per_s /
    TOKENS_PER_ROUND` rounds."""
    return Heartbeat(peer, rnd, 1000, 2.0, tokens_per_s, "0.1.0", records.now() - age_s)


def test_a_peer_in_step_with_the_donors_it_asks_downloads_nothing_and_waits_a_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # heartbeats two seconds old from peers whose last round ran at 12,800 tokens/s: estimated
    # 40 rounds on, though the donors serve the round this peer is at
    beats = [_beat("a", 84, 2.0, 12_800.0), _beat("b", 84, 2.0, 12_800.0)]
    asked: list[str] = []
    downloads: list[str] = []

    def header(_t: Any, donor: str, _run: str, _timeout: float) -> tuple[int, str]:
        asked.append(donor)
        return 86, "digest"

    def download(_t: Any, donor: str, *_args: Any) -> Failed:
        downloads.append(donor)
        return Failed("not reached")

    monkeypatch.setattr(entry_paths, "state_header", header)
    monkeypatch.setattr(entry_paths, "download_state", download)
    rejoin = _rejoin(85, beats)
    assert entry_paths.estimated_round(beats[0], records.now(), TOKENS_PER_ROUND) >= 120
    for r in range(LAG):
        assert rejoin.after_round(_alone(85 + r)) is None
    assert sorted(asked) == ["a", "b"] and downloads == []
    rejoin.after_round(_alone(88))  # within the period: the same heartbeats, not read again
    assert sorted(asked) == ["a", "b"] and downloads == []


def test_a_peer_far_behind_the_rounds_donors_serve_downloads_from_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beats = [_beat("a", 84, 2.0, 0.0), _beat("b", 84, 2.0, 0.0)]
    downloads: list[str] = []

    def download(_t: Any, donor: str, *_args: Any) -> Failed:
        downloads.append(donor)
        return Failed("refused")

    monkeypatch.setattr(entry_paths, "state_header", lambda *_a: (90, "digest"))
    monkeypatch.setattr(entry_paths, "download_state", download)
    rejoin = _rejoin(11, beats)
    for r in range(LAG):
        assert rejoin.after_round(_alone(11 + r)) is None  # every download failed: still alone
    assert sorted(downloads) == ["a", "b"]


def test_donors_that_do_not_answer_or_claim_an_impossible_round_are_not_downloaded_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beats = [_beat("a", 84, 2.0, 0.0), _beat("b", 84, 2.0, 0.0), _beat("c", 84, 2.0, 0.0)]
    served: dict[str, Any] = {"a": Failed("no answer"), "b": (10**9, "digest"), "c": (84, "digest")}
    downloads: list[str] = []

    def download(_t: Any, donor: str, *_args: Any) -> Failed:
        downloads.append(donor)
        return Failed("refused")

    monkeypatch.setattr(entry_paths, "state_header", lambda _t, donor, *_a: served[donor])
    monkeypatch.setattr(entry_paths, "download_state", download)
    rejoin = _rejoin(11, beats)
    for r in range(LAG):
        rejoin.after_round(_alone(11 + r))
    # a silent donor would cost a stall timeout, and a round past the run's end (the defences'
    # window) says the donor lies: only c, which answered at a possible round, is tried
    assert downloads == ["c"]
