"""One attacked swarm on loopback: honest `join` peers, one hostile node, and what the honest saw.

`run_attack` starts a bootstrap node, the attacker (before the honest peers where it must be
there first: forged records, a poisoned donor, endless streams; with them for a hostile
training peer), waits for the honest peers to finish their rounds, stops and reaps
everything by PID (`LocalSwarm`), and returns an `Outcome` read from the honest peers' metrics.
For an attack on a peer that comes back (`RESTARTS`), the first honest peer leaves cleanly a
twentieth of the way through its rounds and starts again under the same identity; a clean run
does the same with `restart`, the control such an attack is measured against. For an attack on
a peer joining a running swarm (`LATE_JOINS`), the last honest peer starts once the others have
recorded `LATE_ROUND`; `late` does the same in a clean run.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from p2p_trainer.config import RunConfig
from p2p_trainer.lab.adversary.attacks import Attack
from p2p_trainer.lab.adversary.launch import attacker_argv, hostile_peer_argv
from p2p_trainer.net.identity import load_or_create_identity
from p2p_trainer.processes import Child, wait_all
from p2p_trainer.round_log import RoundRecord, read_log
from p2p_trainer.run.launcher import LocalSwarm, local_options, peer_args, thread_env

logger = logging.getLogger(__name__)

ATTACKER = -1
"""The attacker's key among `LocalSwarm.peers` (so that `stop` stops it with the peers)."""
RESTARTS = {"replay-leave"}
"""Attacks whose victim must leave and come back during the run."""
LATE_JOINS = {"donor-late"}
"""Attacks on a peer that joins a running swarm: the last honest peer starts once the others have
recorded `LATE_ROUND`."""
LATE_ROUND = 5
DONOR_ADVERTISE_S = 40.0
"""How long the poisoned donor advertises itself: the honest peers' entry (which takes 20 s on a
loaded machine), not much of their training."""


@dataclass(frozen=True)
class Outcome:
    """What the honest peers of one run went through."""

    attack: str
    codes: list[int | None]
    """Exit codes (None: still running when the wait ended, i.e. a hang)."""
    val_losses: list[float | None]
    """Final validation loss of each (None: no final record)."""
    rounds: list[int]
    """Rounds each recorded (fewer than it ended at where it adopted a later round's state)."""
    final_rounds: list[int | None]
    """The round each ended at (None: no final record)."""
    merged_share: list[float]
    """Share of each one's rounds in which every exchange merged with another peer in full."""
    skipped_steps: list[int]
    """Inner steps each left out (alignment, catching up with an adopted state)."""
    fd_peak: int
    """Most file descriptors an honest peer's process held at once (streams in, files, sockets)."""
    rss_peak_mib: float
    """Largest resident memory an honest peer's process held (its own, p2pd not counted), in MiB."""
    attacker_log: str
    wall_s: float

    @property
    def finished(self) -> bool:
        return all(code == 0 for code in self.codes)

    @property
    def mean_loss(self) -> float:
        """Mean final validation loss; inf if any peer has none or a non-finite one."""
        losses = [v if v is not None and math.isfinite(v) else math.inf for v in self.val_losses]
        return statistics.fmean(losses) if losses else math.inf

    def row(self, clean: float) -> str:
        losses = ", ".join("-" if v is None else f"{v:.4g}" for v in self.val_losses)
        return (
            f"{self.attack}: exit {self.codes}, val loss {losses} (clean {clean:.4g}, "
            f"{self.mean_loss / clean - 1:+.1%}), rounds {self.rounds} to {self.final_rounds}, merged "
            f"{[round(s, 2) for s in self.merged_share]}, skipped {self.skipped_steps}, "
            f"fds at most {self.fd_peak}, RSS at most {self.rss_peak_mib:.0f} MiB, {self.wall_s:.0f} s"
        )


def _merged(rounds: list[RoundRecord]) -> float:
    merged = [
        bool(r.exchanges) and all(e.ok and e.group_size >= 2 and e.own_parts == 0 for e in r.exchanges)
        for r in rounds
    ]
    return sum(merged) / max(1, len(merged))


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _rss_mib(pid: int) -> float:
    """The process's resident memory now (VmRSS), in MiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


class HoldWatch:
    """The most file descriptors, and the most resident memory (VmRSS), any of `pids` held,
    sampled twice a second."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.peak = 0
        self.rss_peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self, pids: list[int]) -> None:
        self.pids = pids
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max([self.peak, *(_fds(pid) for pid in self.pids)])
            self.rss_peak_mib = max([self.rss_peak_mib, *(_rss_mib(pid) for pid in self.pids)])

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _wait_log(path: Path, mark: str, timeout_s: float, child: Child) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.alive():
        if path.exists() and mark in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


class Arena(LocalSwarm):
    """A `LocalSwarm` that also starts hostile nodes."""

    def start_argv(self, key: int, name: str, argv: list[str]) -> Child:
        log = self.opts.run_dir / name / "log.txt"
        child = Child(name, argv, log, thread_env(self.opts.torch_threads))
        self.started.append(child)
        self.peers[key] = child
        return child

    def start_first(self, attack: Attack, victims: list[str]) -> Child:
        """An attacker that must be in the swarm before the honest peers; waits until it acts."""
        run_dir = self.opts.run_dir
        donor = attack.kind == "donor"
        argv = attacker_argv(
            attack,
            self.initial_peers,
            victims,
            config=self.opts.config_path,
            advertise_s=DONOR_ADVERTISE_S if donor else None,
            identity=run_dir / "keys" / "attacker.key" if donor else None,
        )
        attacker = self.start_argv(ATTACKER, "attacker", argv)
        mark = {"donor": "ready", "records": "stored", "streams": "is up"}[attack.kind]
        if not _wait_log(run_dir / "attacker" / "log.txt", mark, 90, attacker):
            raise RuntimeError(f"the attacker did not start: see {run_dir / 'attacker' / 'log.txt'}")
        return attacker


def run_attack(
    run_dir: Path,
    cfg: RunConfig,
    attack: Attack | None,
    honest: int = 3,
    timeout_s: float = 180.0,
    restart: bool | None = None,
    late: bool | None = None,
) -> Outcome:
    """Run `honest` peers (and `attack`'s node) to the end of `cfg.rounds`; see the module's doc.
    `restart`: whether the first peer leaves and comes back; `late`: whether the last one starts
    once the others have recorded `LATE_ROUND` (None: where the attack needs it)."""
    kind = None if attack is None else attack.kind
    if restart is None:
        restart = attack is not None and attack.name in RESTARTS
    if late is None:
        late = attack is not None and attack.name in LATE_JOINS
    opts = local_options(run_dir, cfg, peers=honest + (kind == "peer"))
    victims = [load_or_create_identity(run_dir / "keys" / f"peer{i}.key").peer_id for i in range(honest)]
    watch = HoldWatch()
    t0 = time.monotonic()
    swarm = Arena(opts)
    with swarm:
        swarm.start_bootstrap()
        attacker: Child | None = None
        if attack is not None and kind in ("records", "donor", "streams"):
            attacker = swarm.start_first(attack, victims)
        peers = [swarm.start_peer(i) for i in range(honest - 1 if late else honest)]
        watch.start([p.pid for p in peers])
        if attack is not None and kind == "peer":
            argv = hostile_peer_argv(peer_args(opts, honest), swarm.initial_peers, attack)
            attacker = swarm.start_argv(honest, f"peer{honest}", argv)
        try:
            if late:
                for i in range(honest - 1):
                    _wait_recorded(swarm, i, LATE_ROUND, timeout_s)
                peers.append(swarm.start_peer(honest - 1))
                watch.pids.append(peers[-1].pid)
            if restart:
                peers[0] = _restart(swarm, 0, max(1, cfg.rounds // 20), timeout_s)
                watch.pids[0] = peers[0].pid
            wait_all(peers, timeout_s)
        finally:
            watch.close()
        codes = [p.proc.poll() for p in peers]
    log = None if attacker is None else run_dir / attacker.name / "log.txt"
    name = str(attack) if attack else "clean"
    return _outcome(run_dir, name, honest, codes, watch, log, t0)


def _restart(swarm: LocalSwarm, i: int, after_round: int, timeout_s: float) -> Child:
    """Stop peer `i` cleanly (SIGINT: it leaves a tombstone) once it has recorded `after_round`,
    then start it again under the same identity; the new process. Raises if the peer never got
    there or did not leave cleanly: the arm would not test what it names."""
    path = swarm.opts.run_dir / f"peer{i}" / "metrics.jsonl"
    child = swarm.peers[i]
    _wait_recorded(swarm, i, after_round, timeout_s)
    # its DHT node and p2pd gone too before another process takes the same identity
    code = child.stop(timeout_s=60, sig=signal.SIGINT)
    if code != 128 + signal.SIGINT:  # how `join` exits once it has left after a signal (cli.py)
        raise RuntimeError(f"peer{i} did not leave cleanly (exit {code}): see {path.parent / 'log.txt'}")
    logger.info("peer%d left at round %d or later; starting it again", i, after_round)
    return swarm.start_peer(i)


def _wait_recorded(swarm: LocalSwarm, i: int, round: int, timeout_s: float) -> None:
    """Wait until peer `i` has recorded `round`; raises if it exits or `timeout_s` passes first."""
    path = swarm.opts.run_dir / f"peer{i}" / "metrics.jsonl"
    child = swarm.peers[i]
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and any(r.round >= round for r in read_log(path).rounds)):
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"peer{i} did not reach round {round}: see {path.parent / 'log.txt'}")
        time.sleep(0.2)


def _outcome(
    run_dir: Path,
    name: str,
    honest: int,
    codes: list[int | None],
    held: HoldWatch,
    attacker_log: Path | None,
    t0: float,
) -> Outcome:
    logs = [read_log(run_dir / f"peer{i}" / "metrics.jsonl") for i in range(honest)]
    text = attacker_log.read_text(errors="replace") if attacker_log and attacker_log.exists() else ""
    return Outcome(
        attack=name,
        codes=codes,
        # the last final record: a peer that left and came back (`RESTARTS`) wrote one per life
        val_losses=[log.finals[-1].val_loss if log.finals else None for log in logs],
        rounds=[len(log.rounds) for log in logs],
        final_rounds=[log.finals[-1].round if log.finals else None for log in logs],
        merged_share=[_merged(log.rounds) for log in logs],
        skipped_steps=[sum(r.skipped_steps for r in log.rounds) for log in logs],
        fd_peak=held.peak,
        rss_peak_mib=held.rss_peak_mib,
        attacker_log=text,
        wall_s=time.monotonic() - t0,
    )
