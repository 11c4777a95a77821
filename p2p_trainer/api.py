"""Bring one's own model to a swarm from Python: `Swarm` and its `Trainer` (docs/python-api.md).

A `Swarm` is this process's node: a DHT node with its identity, joined to what its initial peers
reach. `Swarm.trainer(model, loss_fn, batches)` makes it a training peer of `model` with the very
stages of `p2p-trainer join` (`run/join.py`): the run definition checked against the swarm's, wire
transport, swarm view, exchange and state server, the swarm's state downloaded if its run is
under way. `Trainer.rounds()` is join's round loop, one round per item, and `Trainer.finish()`
its ending: the final agreement with every live peer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from p2p_trainer.config import RunConfig, load_config
from p2p_trainer.net.admission import Admission, check_entry
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node
from p2p_trainer.net.swarm_entry import enter_run
from p2p_trainer.round_log import FinalRecord
from p2p_trainer.run.join import Joined, JoinOptions, each_round, enter, finish, start
from p2p_trainer.run.round_lines import ObservedWriter, log_record
from p2p_trainer.train.trainer import Peer, RoundMetrics
from p2p_trainer.train.workload import IterableBatches, LossFn, Workload, model_fingerprint


@dataclasses.dataclass(frozen=True)
class OwnModelRun(RunConfig):
    """A run of one's own model and data. The `model` and `data` sections do not apply: the run
    definition names the run and the model's fingerprint instead (`workload.model_fingerprint`),
    so peers with another model, or the same model from other initial weights, refuse each other."""

    run_name: str = ""
    model_parameters: str = ""
    """Digest of the trainable parameters' names, shapes and dtypes."""
    model_num_params: int = 0
    model_initial_weights: str = ""
    """Digest of the trainable parameters' initial values."""

    def workload_definition(self) -> dict[str, Any]:
        own = {
            "parameters": self.model_parameters,
            "num_params": self.model_num_params,
            "initial_weights": self.model_initial_weights,
        }
        return {"run_name": self.run_name, "own_model": own}


def run_config(
    config: RunConfig | None = None,
    method: str | None = None,
    inner_steps: int | None = None,
    rounds: int | None = None,
    seed: int | None = None,
) -> RunConfig:
    """`config` (default: the shipped run, the one `p2p-trainer join` runs without a config file)
    with the shortcuts that are given on top. A `method` applies to the shipped run as `--method`
    does: the shipped [outer] values (H) and the exchange settings stay, and the method's reference
    hyperparameters (`METHOD_DEFAULTS`) fill the rest; so it cannot also come in `config`."""
    if config is None:
        base = load_config(None, method=method)  # as `join --method` without a config file
    elif method is not None and method != config.outer.method:
        raise ValueError(
            f"method={method!r} but config.outer.method={config.outer.method!r}: give the method in one place"
        )
    else:
        base = config
    outer = base.outer
    if inner_steps is not None:
        outer = dataclasses.replace(outer, num_inner_steps=inner_steps)
    cfg = dataclasses.replace(
        base,
        outer=outer,
        rounds=base.rounds if rounds is None else rounds,
        seed=base.seed if seed is None else seed,
    )
    if cfg.outer.target_tokens_per_round:
        raise ValueError(
            "outer.target_tokens_per_round: constant work per round is not available for a model of "
            "one's own yet; set it to 0"
        )
    return cfg


class Swarm:
    """This process's node in the swarm `run_name`; a context manager (`close` on leaving).

    `initial_peers`: multiaddrs of running nodes (another Swarm's `addresses`), or the
    `--initial-peers ...` text `p2p-trainer bootstrap` prints; none starts a new swarm. `method`, `inner_steps`, `rounds` and `seed`
    set those fields of `config` (default: the shipped run, `load_config(None)`, as the command
    line's), which holds everything else: exchange,
    network and security settings, and the inner optimizer built when none is given. `identity`
    is the node's key file (default: a new one, so a new peer id), `run_dir` where metrics.jsonl
    goes (default: a temporary directory, removed on `close`). `stop`, once set, ends the rounds
    between two inner steps.
    """

    def __init__(
        self,
        run_name: str,
        initial_peers: Sequence[str] | str = (),
        *,
        method: str | None = None,
        inner_steps: int | None = None,
        rounds: int | None = None,
        seed: int | None = None,
        config: RunConfig | None = None,
        host: str = DHTConfig.host,
        port: int = 0,
        announce_host: str | None = None,
        identity: str | Path | None = None,
        run_dir: str | Path | None = None,
        wait_for_peers: int = 1,
        wait_timeout_s: float = 60.0,
        invitation: str = "",
        stop: threading.Event | None = None,
    ) -> None:
        if not run_name or "/" in run_name:
            raise ValueError(f"run_name={run_name!r}: use a non-empty name without '/'")
        self.run_name, self.config = run_name, run_config(config, method, inner_steps, rounds, seed)
        self.stop = stop or threading.Event()
        self.wait_for_peers, self.wait_timeout_s = wait_for_peers, wait_timeout_s
        if isinstance(initial_peers, str):  # as bootstrap prints it, ready to paste
            initial_peers = [word for word in initial_peers.split() if word != "--initial-peers"]
        self._invitation = invitation
        self._leave = contextlib.ExitStack()
        try:
            if run_dir is None:
                run_dir = self._leave.enter_context(tempfile.TemporaryDirectory(prefix="p2p-trainer-"))
            self.run_dir = Path(run_dir)
            key = Path(identity).expanduser() if identity else self.run_dir / "identity.key"
            self._dht = DHTConfig(
                identity_path=str(key),
                host=host,
                port=port,
                announce_host=announce_host,
                initial_peers=tuple(initial_peers),
                verify_records=self.config.security.defences,
                swarm=self.run_name,
            )
            self.node: NetNode = start_node(self._dht, stop=self.stop)
            self._leave.callback(self.node.shutdown)
        except BaseException:
            self._leave.close()
            raise
        self._wired = False
        """A trainer was wired onto the node (even if its entry failed later): one per node."""

    @property
    def peer_id(self) -> str:
        return self.node.peer_id

    @property
    def addresses(self) -> list[str]:
        """Multiaddrs other peers can give as `initial_peers` to join this swarm through this node."""
        return self.node.visible_maddrs()

    def trainer(
        self,
        model: torch.nn.Module,
        loss_fn: LossFn,
        batches: Iterable[Any],
        *,
        optimizer: torch.optim.Optimizer | None = None,
        lr_schedule: Callable[[int], float] | None = None,
        val_batches: Iterable[Any] | None = None,
        tokens_per_batch: int = 1,
        device: str | None = None,
    ) -> Trainer:
        """Make this node a training peer of `model`: `loss_fn(model, batch)` is a micro-batch's
        loss, `batches` any iterable of batches (re-iterated when it ends, unless it is a one-shot
        iterator). `optimizer` (over `model.parameters()`) makes the inner steps, at its own
        learning rate times `lr_schedule(step)` (default 1); without one, AdamW with the config's
        `inner` settings and schedule. `val_batches` (kept in a list) give the validation loss of
        the final model. Each micro-batch weighs `tokens_per_batch` in the peers' weighted means.
        `device` (default: cuda if available, else cpu) is where the model trains; batches are
        moved there. Every peer must build `model` from the same initial weights; the run definition compares
        them, with the parameters' names and shapes. Returns once the peer is in the swarm (its
        state downloaded, if the run is under way) and `wait_for_peers` peers are live."""
        if self._wired:
            raise RuntimeError(
                "this Swarm has a trainer already: a node trains one model; open another Swarm"
            )
        if tokens_per_batch < 1:
            raise ValueError(f"tokens_per_batch={tokens_per_batch}: use at least 1")
        fingerprint = model_fingerprint(model)
        initial = tuple(p.detach().cpu().clone() for p in model.parameters() if p.requires_grad)
        cfg = OwnModelRun(
            **{f.name: getattr(self.config, f.name) for f in dataclasses.fields(RunConfig)},
            run_name=self.run_name,
            model_parameters=fingerprint.parameters,
            model_num_params=fingerprint.num_params,
            model_initial_weights=fingerprint.initial_weights,
        )
        workload = Workload(
            model=model,
            loss_fn=_checked(loss_fn),
            batches=IterableBatches(batches),
            tokens_per_batch=tokens_per_batch,
            initial_weights=lambda: initial,
            val_batches=None if val_batches is None else list(val_batches),
            optimizer=optimizer,
            lr_schedule=lr_schedule or (_constant if optimizer is not None else None),
        )
        opts = JoinOptions(
            run=cfg,
            dht=self._dht,
            run_dir=self.run_dir,
            wait_for_peers=self.wait_for_peers,
            wait_timeout_s=self.wait_timeout_s,
            checkpoint_every=0,
            device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
            swarm=self.run_name,
            invitation=self._invitation,
        )
        admission = Admission(cfg.security, self.run_name)
        enter_run(
            self.node,
            self.run_name,
            cfg.run_definition(),
            cfg.network.run_definition_ttl_s,
            lambda node: check_entry(admission, node, self._invitation),
        )
        self._wired = True
        metrics = ObservedWriter(self.run_dir / "metrics.jsonl", [log_record])
        self._leave.callback(metrics.close)
        joined = start(opts, self.node, metrics, self._leave, workload)
        enter(joined, rejoining=False)
        return Trainer(joined, self.stop)

    def close(self) -> None:
        """Leave the swarm: stop heartbeats and exchanges, shut the node down (idempotent)."""
        self._leave.close()

    def __enter__(self) -> Swarm:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Trainer:
    """This process's training peer (`Swarm.trainer`): the method's rounds over the user's model."""

    def __init__(self, joined: Joined, stop: threading.Event) -> None:
        self._joined, self._stop = joined, stop
        self._rounds = each_round(joined, stop.is_set)
        self.final: FinalRecord | None = None
        """The final record, once `finish` ran."""

    @property
    def peer(self) -> Peer:
        """The peer itself: its method, outer state (`peer.state.anchor`: φ), optimizer and counters."""
        return self._joined.peer

    @property
    def model(self) -> torch.nn.Module:
        return self._joined.peer.model

    @property
    def round(self) -> int:
        """The next round's number (the rounds done so far, the swarm's before a late join included)."""
        return self._joined.peer.state.round

    def rounds(self, max_rounds: int | None = None) -> Iterator[RoundMetrics]:
        """Train round after round, yielding each one's metrics once it is exchanged and recorded,
        until the run's `rounds` are done, `max_rounds` more have run or the stop event is set.
        The next round starts when the loop asks for it; a later call carries on from there."""
        for _ in itertools.count() if max_rounds is None else range(max_rounds):
            m = next(self._rounds, None)
            if m is None:
                return
            yield m

    def finish(self) -> FinalRecord:
        """End the run as `p2p-trainer join` does: unless stopped, one blocking average of the
        anchors with every live peer (the final agreement), so all peers keep the same model,
        copied into `model`; then the final record (its validation loss with `val_batches`).
        Runs once; later calls return the same record."""
        if self.final is None:
            self.final = finish(self._joined, stopped=self._stop.is_set(), stop_requested=self._stop.is_set)
            with torch.no_grad():  # the model holds φ, the agreed weights, not a mid-round θ
                for p, a in zip(self.peer.params, self.peer.state.anchor, strict=True):
                    p.copy_(a)
        return self.final


def _constant(step: int) -> float:
    return 1.0


def _checked(loss_fn: LossFn) -> LossFn:
    """`loss_fn`, refusing a training loss that carries no gradient, with the likely cause."""

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        value = loss_fn(model, batch)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"loss_fn must return a scalar tensor, not {type(value).__name__}")
        if torch.is_grad_enabled() and not value.requires_grad:
            raise ValueError(
                "loss_fn returned a loss without gradient: gradients are off (a generator of batches "
                "that yields inside `with torch.no_grad()` turns them off for its caller) or the "
                "loss does not depend on the model's trainable parameters"
            )
        return value

    return loss
