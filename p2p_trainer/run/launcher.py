"""Launching a swarm: a bootstrap node, the `--initial-peers` line it prints, and `join` peers.

Every launcher builds the command lines here: `p2p-trainer local`, the chaos runner, the WAN bench
and the tests. On loopback `LocalSwarm` starts them as tracked children (`processes.Child`: own
session, always reaped, with everything they started); inside testbed namespaces the caller
starts the same argv with `tb.run(host, argv, ...)` and reads the bootstrap node's address with
the same `read_initial_peers`.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from p2p_trainer.config import RunConfig, to_toml
from p2p_trainer.processes import Child, reap_tree
from p2p_trainer.run.progress_file import PROGRESS_FILE
from p2p_trainer.train.checkpoint import atomic_write_text

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class BootstrapStartError(RuntimeError):
    """The bootstrap node exited, or printed no `--initial-peers` line in time."""


@dataclass(frozen=True)
class LocalOptions:
    config_path: Path
    """The run config every peer loads (written into the run directory)."""
    run: RunConfig
    """That config, parsed."""
    peers: int
    """Peer processes to start."""
    run_dir: Path
    """Keys (keys/), the bootstrap node's log and one directory per peer (peer{i}/) go here."""
    max_minutes: float | None = None
    """Every peer's wall-time limit (None: it stops after its rounds)."""
    torch_threads: int = 1
    """Torch threads per peer process."""
    startup_timeout_s: float = 60.0
    """How long the bootstrap node may take to print its address."""
    compare_independent: bool = False
    """After the swarm, run as many peers with method independent (same rounds or time bound, same
    data streams) under run_dir/independent, and report the swarm's gain over training alone."""
    metrics_port_base: int | None = None
    """Prometheus endpoints: peer i on this port + i, the bootstrap node on this port + peers."""
    dashboard_port: int | None = None
    """`p2p-trainer dashboard` of the swarm on this loopback port (0: any free one); None: none."""


def local_options(
    run_dir: Path, cfg: RunConfig, peers: int, torch_threads: int = 1, max_minutes: float | None = None
) -> LocalOptions:
    """Options for a swarm of `peers` running `cfg`, with the config written to run_dir/config.toml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.toml"
    atomic_write_text(path, to_toml(cfg))
    return LocalOptions(path, cfg, peers, run_dir, max_minutes=max_minutes, torch_threads=torch_threads)


def python_argv() -> list[str]:
    return [sys.executable, "-m", "p2p_trainer"]


def record_checks(cfg: RunConfig) -> list[str]:
    """The bootstrap options matching `cfg`'s peers: peers with the defences off accept unsigned
    records, and a bootstrap node that refused them would hide what forged records do there."""
    return [] if cfg.security.defences else ["--verify-records", "off"]


def bootstrap_argv(
    identity: Path,
    host: str = LOOPBACK,
    port: int = 0,
    status_interval_s: float = 30.0,
    extra: Sequence[str] = (),
) -> list[str]:
    """`p2p-trainer bootstrap`; it prints `--initial-peers <multiaddr>` on stdout once it listens."""
    return [
        *python_argv(),
        "bootstrap",
        "--host",
        host,
        "--port",
        str(port),
        "--identity",
        str(identity),
        "--status-interval-s",
        f"{status_interval_s:g}",
        *extra,
    ]


@dataclass(frozen=True)
class JoinArgs:
    """The options of one `p2p-trainer join` peer."""

    config_path: Path
    """The run config it loads."""
    identity: Path
    """Its identity key (created on first use)."""
    run_dir: Path
    """Its metrics, checkpoints and snapshots."""
    host: str = LOOPBACK
    """The address it listens on."""
    wait_for_peers: int = 1
    """Peers it waits for before its first round."""
    torch_threads: int = 1
    """Torch threads of its process."""
    data_key: str | None = None
    """Its data stream (None: join's default, from its identity)."""
    max_minutes: float | None = None
    """Its wall-time limit (None: it stops after its rounds)."""
    tensorboard_dir: Path | None = None
    """Its own TensorBoard directory (None: the config's [log] tensorboard_dir, if any)."""
    extra: tuple[str, ...] = ()
    """More `join` options, after the others (a repeated option overrides the earlier one)."""


def join_argv(args: JoinArgs, initial_peers: str) -> list[str]:
    """`p2p-trainer join` with `initial_peers` as the bootstrap node printed it. The config file
    holds the whole run already (flags and environment resolved), so the peer does not apply the
    P2PT_ variables again: they would override the flags the file was resolved with."""
    argv = [*python_argv(), "join", "--ignore-env", "--config", str(args.config_path)]
    argv += initial_peers.split()
    argv += ["--identity", str(args.identity), "--host", args.host, "--run-dir", str(args.run_dir)]
    argv += ["--wait-for-peers", str(args.wait_for_peers), "--torch-threads", str(args.torch_threads)]
    if args.data_key is not None:
        argv += ["--data-key", args.data_key]
    if args.max_minutes:
        argv += ["--minutes", str(args.max_minutes)]
    if args.tensorboard_dir is not None:
        argv += ["--tensorboard-dir", str(args.tensorboard_dir)]
    return [*argv, *args.extra]


def peer_args(opts: LocalOptions, i: int, host: str = LOOPBACK, extra: Sequence[str] = ()) -> JoinArgs:
    """Peer i of a local swarm: identity keys/peer{i}.key, run directory peer{i}/, and with
    [log] tensorboard_dir set, TensorBoard directory peer{i}/ under it (peers writing one
    directory would interleave their curves)."""
    board = opts.run.log.tensorboard_dir
    return JoinArgs(
        config_path=opts.config_path,
        identity=opts.run_dir / "keys" / f"peer{i}.key",
        run_dir=opts.run_dir / f"peer{i}",
        host=host,
        wait_for_peers=opts.peers,
        torch_threads=opts.torch_threads,
        data_key=f"peer{i}",  # the same streams as the in-process reference's peer i
        max_minutes=opts.max_minutes,
        tensorboard_dir=Path(board).absolute() / f"peer{i}" if board else None,
        extra=tuple(extra),
    )


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _log_tail(log_path: Path, lines: int = 5) -> str:
    try:
        text = log_path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def read_initial_peers(proc: subprocess.Popen[Any], log_path: Path, timeout_s: float) -> str:
    """The `--initial-peers ...` line a starting bootstrap node prints first on its (piped) stdout.

    Raises `BootstrapStartError` naming its log when it exits first or prints nothing in time;
    stopping it is the caller's part (a `Child` or the testbed owns it).
    """
    line = _first_line(proc, timeout_s)
    if line is not None and line.startswith("--initial-peers"):
        return line
    try:
        code: int | None = proc.wait(timeout=1.0) if line is not None else proc.poll()
    except subprocess.TimeoutExpired:
        code = None
    why = (
        f"it exited with code {code}"
        if code is not None
        else f"it printed {line[:200]!r} instead of its address"
        if line
        else f"it printed no address within {timeout_s:.0f} s"
    )
    tail = _log_tail(log_path)
    raise BootstrapStartError(
        f"the bootstrap node did not start: {why}; see {log_path}" + (f":\n{tail}" if tail else "")
    )


def check_metrics_ports(opts: LocalOptions) -> None:
    """Raise `RuntimeError` naming `--metrics-port-base` if a port it gives is taken: found before
    anything starts, not in one peer's log after the others are running."""
    base = opts.metrics_port_base
    if base is None:
        return
    names = [*(f"peer{i}" for i in range(opts.peers)), "the bootstrap node"]
    for offset, name in enumerate(names):
        port = base + offset
        if port > 65535:
            raise RuntimeError(f"--metrics-port-base {base}: {name} would need port {port}, past 65535")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((LOOPBACK, port))
            except OSError as exc:
                raise RuntimeError(
                    f"--metrics-port-base {base}: port {port} for {name} is not free ({exc.strerror}); "
                    f"pick another base"
                ) from None


def dashboard_argv(initial_peers: str, port: int, run_dir: Path, host: str = LOOPBACK) -> list[str]:
    """`p2p-trainer dashboard` of the swarm `initial_peers` reaches, with the exchanges recorded
    under `run_dir`; it prints `dashboard at <url> ...` on stdout once it listens."""
    argv = [*python_argv(), "dashboard", *initial_peers.split(), "--host", host, "--port", str(port)]
    return [*argv, "--run-dir", str(run_dir)]


def check_dashboard_port(opts: LocalOptions) -> None:
    """Raise `RuntimeError` naming `--dashboard-port` if that port is taken, before anything starts."""
    port = opts.dashboard_port
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the dashboard's server binds
        try:
            probe.bind((LOOPBACK, port))
        except OSError as exc:
            raise RuntimeError(
                f"--dashboard-port {port}: the port is not free on {LOOPBACK} ({exc.strerror}); pick a "
                f"free port for --dashboard-port or stop what listens on it"
            ) from None


def _first_line(proc: subprocess.Popen[Any], timeout_s: float) -> str | None:
    """The first line `proc` prints on its piped stdout, stripped; "" if it closed its stdout
    (exited) first, None if nothing came within `timeout_s`."""
    stdout = proc.stdout
    assert stdout is not None, "stdout must be a pipe"
    box: list[str] = []

    def read() -> None:
        line = stdout.readline()
        box.append(line.decode(errors="replace") if isinstance(line, bytes) else line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else None


class LocalSwarm:
    """A bootstrap node and peer processes on loopback, as tracked children.

    `stop` (also on leaving a `with` block) stops and reaps every process it started, restarted
    peers' earlier lives included, and waits for what they started in other sessions.
    """

    def __init__(self, opts: LocalOptions) -> None:
        self.opts = opts
        self.boot: Child | None = None
        self.peers: dict[int, Child] = {}
        """The current process of each peer."""
        self.initial_peers = ""
        """The bootstrap node's `--initial-peers <multiaddr>` line."""
        self.started: list[Child] = []
        self.dashboard: Child | None = None
        """Every process started, in order."""

    def _start(self, child: Child) -> Child:
        self.started.append(child)
        return child

    def _metrics_args(self, offset: int) -> list[str]:
        base = self.opts.metrics_port_base
        return [] if base is None else ["--metrics-port", str(base + offset), "--metrics-host", LOOPBACK]

    def start_bootstrap(self) -> Child:
        log = self.opts.run_dir / "bootstrap.log"
        argv = bootstrap_argv(
            self.opts.run_dir / "keys" / "bootstrap.key",
            extra=[*self._metrics_args(self.opts.peers), *record_checks(self.opts.run)],
        )
        boot = self._start(Child("bootstrap", argv, log))
        try:
            self.initial_peers = read_initial_peers(boot.proc, log, self.opts.startup_timeout_s)
        except BootstrapStartError:
            boot.stop(timeout_s=5)
            raise
        self.boot = boot
        return boot

    def start_peer(self, i: int, extra: Sequence[str] = ()) -> Child:
        """Start peer i (again, after a kill: under the same identity); `extra`: more join options."""
        extra = [*self._metrics_args(i), *extra]  # a test's own --metrics-port comes last and wins
        argv = join_argv(peer_args(self.opts, i, extra=extra), self.initial_peers)
        log = self.opts.run_dir / f"peer{i}" / "log.txt"
        # a reused run directory (or a restart) holds the last process's progress, which the live
        # table would show until the new process has imported enough to write "starting"
        (self.opts.run_dir / f"peer{i}" / PROGRESS_FILE).unlink(missing_ok=True)
        self.peers[i] = self._start(Child(f"peer{i}", argv, log, thread_env(self.opts.torch_threads)))
        return self.peers[i]

    def start_dashboard(self, port: int) -> str:
        """`p2p-trainer dashboard` of this swarm on loopback `port` (0: any free one), showing the
        peers' exchanges from the run directory; its URL, once it listens."""
        log = self.opts.run_dir / "dashboard.log"
        argv = dashboard_argv(self.initial_peers, port, self.opts.run_dir)
        self.dashboard = self._start(Child("dashboard", argv, log))
        line = _first_line(self.dashboard.proc, self.opts.startup_timeout_s) or ""
        if line.startswith("dashboard at "):
            return line.split()[2]
        self.dashboard.stop(timeout_s=5)
        tail = _log_tail(log)
        raise RuntimeError(f"the dashboard did not start; see {log}" + (f":\n{tail}" if tail else ""))

    def stop(self, peer_timeout_s: float = 60.0, boot_timeout_s: float = 15.0) -> None:
        """SIGINT every peer (clean shutdown), wait for them, then for the bootstrap node; reap all."""
        current = [*self.peers.values(), *([self.dashboard] if self.dashboard else [])]
        for child in current:  # all at once: a peer waiting on a stopped partner would stall
            child.send(signal.SIGINT)
        for child in current:
            child.stop(timeout_s=peer_timeout_s, wait_tree=False)
        if self.boot is not None:
            self.boot.stop(timeout_s=boot_timeout_s, wait_tree=False)
        for child in self.started:  # earlier lives of restarted peers (the others return at once)
            child.stop(timeout_s=peer_timeout_s, wait_tree=False)
        tree = {pid: started for child in self.started for pid, started in child.tree.items()}
        reap_tree(tree, owners=[child.pid for child in self.started])

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
