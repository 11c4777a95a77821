"""The run config's plain sections: model, data, inner optimiser, exchange and network timing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from p2p_trainer.config.checks import check_fields, choices, require

WireDtype = Literal["float32", "float16"]
WIRE_DTYPES: tuple[str, ...] = choices(WireDtype)


@dataclass(frozen=True)
class ModelConfig:
    """The transformer's shape."""

    vocab_size: int = 256
    """Byte-level tokens by default."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads per block; must divide d_model."""
    seq_len: int = 128
    """Context length in tokens (learned positions up to this length)."""
    mlp_ratio: int = 4
    """Hidden width of each MLP as a multiple of d_model."""
    dropout: float = 0.0
    """Dropout probability in [0, 1)."""

    def __post_init__(self) -> None:
        check_fields(self, "model")
        require(self.vocab_size >= 2, f"model.vocab_size={self.vocab_size}: use at least 2 (256 for bytes)")
        require(self.d_model > 0 and self.n_layers > 0, "model.d_model and model.n_layers must be positive")
        require(
            self.n_heads > 0 and self.d_model % self.n_heads == 0,
            f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}",
        )
        require(self.seq_len >= 2, f"model.seq_len={self.seq_len}: use at least 2")
        require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout}: use a value in [0, 1)")


@dataclass(frozen=True)
class DataConfig:
    """The corpus and how it is batched."""

    corpus: str = "shakespeare"
    """'shakespeare' (bundled plays) or a path to a text file or a directory of .txt files."""
    val_fraction: float = 0.1
    """Share of documents (whole plays/files) held out for validation, never trained on."""
    batch_size: int = 16
    """Sequences per micro-batch."""
    val_batches: int = 8
    """Micro-batches per validation-loss estimate (fixed, so estimates are comparable)."""

    def __post_init__(self) -> None:
        check_fields(self, "data")
        require(
            0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction}: use a value in (0, 1)"
        )
        require(self.batch_size > 0, f"data.batch_size={self.batch_size}: use a positive number")
        require(self.val_batches > 0, f"data.val_batches={self.val_batches}: use a positive number")


@dataclass(frozen=True)
class InnerConfig:
    """Each peer's local optimiser (AdamW) between outer rounds."""

    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's (β1, β2), each in [0, 1)."""
    warmup_steps: int = 20
    """Linear warm-up of the learning rate over this many inner steps."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at the end of the run."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    grad_accum: int = 1
    """Micro-batches per inner step."""
    bf16: bool = False
    """bf16 autocast for forward/backward (use on GPU)."""
    eval_every: int = 50
    """Validation loss every this many inner steps; 0 = only at the end."""

    def __post_init__(self) -> None:
        check_fields(self, "inner")
        require(self.lr > 0, f"inner.lr={self.lr}: use a positive learning rate")
        require(self.weight_decay >= 0, f"inner.weight_decay={self.weight_decay}: use >= 0")
        require(all(0 <= b < 1 for b in self.betas), f"inner.betas={self.betas}: use values in [0, 1)")
        require(self.warmup_steps >= 0, "inner.warmup_steps must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, "inner.min_lr_ratio must be in [0, 1]")
        require(self.grad_clip >= 0, "inner.grad_clip must be >= 0 (0 disables)")
        require(self.grad_accum >= 1, f"inner.grad_accum={self.grad_accum}: use at least 1")
        require(self.eval_every >= 0, "inner.eval_every must be >= 0")


@dataclass(frozen=True)
class ExchangeConfig:
    """How a blocking exchange runs (§4): quorum, grace window, time limits and wire format."""

    timeout_s: float = 60.0
    """Upper bound on a blocking exchange; a timed-out exchange is a Failed value."""
    mix1_grace_s: float = 5.0
    """Extra wait for Mix1 at round end before falling back to the own anchor (§3, §4)."""
    quorum_fraction: float = 0.5
    """§4: a blocking exchange proceeds once ceil(fraction · group size) members (self included)
    have contributed, then waits at most the grace window for the rest. 1.0 waits for everyone
    (still bounded by `quorum_wait_max_s`)."""
    quorum_wait_max_s: float = 15.0
    """Longest wait for the quorum itself; past it the exchange merges whatever arrived."""
    grace_overlap_steps: float = 5.0
    """τ: inner steps' worth of time one accepts to wait for stragglers after the quorum."""
    grace_gamma: float = 1.0
    """γ_g: scale of the adaptive grace window."""
    grace_min_s: float = 1.0
    """Floor of the grace window (ours: covers network jitter when steps are very short)."""
    grace_max_s: float = 5.0
    """Cap of the grace window; a survivor's pause is at most `pause_bound_s`."""
    grace_margin: float = 1.25
    """The window covers at least this many times the observed time for members' contributions
    to arrive (start skew + transfer), so punctual members on a slow link are not left out."""
    wire_dtype: WireDtype = "float32"
    """Number format of exchanged values on the wire: float32, or float16 (half the bytes, so half
    the time on a slow link; values are averaged in float64 either way, and a part holding a value
    beyond float16's range is sent as float32). Every member of a group gets identical results."""
    final_agreement: bool = True
    """At the end of a run (rounds done or time bound, not a stop signal) every peer takes part in
    one last all-peer average of its anchor φ, so each ends holding the swarm's consensus model.
    Method "independent" never exchanges, so it ignores this. A failed final exchange keeps the
    peer's own model (run/final_agreement.py)."""
    final_wait_s: float = 60.0
    """Longest a finishing peer waits in the final agreement for the others (then at most
    `timeout_s` for the transfer): it covers the skew between the peers' ends (a time bound starts
    when each peer started, and a peer still training waits up to `quorum_wait_max_s` in each of
    its last rounds' exchanges for the peers already in the final agreement)."""

    def __post_init__(self) -> None:
        check_fields(self, "exchange")
        require(self.final_wait_s > 0, f"exchange.final_wait_s={self.final_wait_s}: use a positive value")
        require(self.timeout_s > 0, f"exchange.timeout_s={self.timeout_s}: use a positive value")
        require(self.mix1_grace_s >= 0, "exchange.mix1_grace_s must be >= 0")
        require(
            0 < self.quorum_fraction <= 1,
            f"exchange.quorum_fraction={self.quorum_fraction}: use a value in (0, 1] (0.5 = half the group)",
        )
        require(self.quorum_wait_max_s > 0, "exchange.quorum_wait_max_s must be positive")
        require(self.grace_overlap_steps >= 0, "exchange.grace_overlap_steps must be >= 0")
        require(self.grace_gamma >= 0, "exchange.grace_gamma must be >= 0")
        require(
            self.grace_margin >= 1, f"exchange.grace_margin={self.grace_margin}: use >= 1 (1.25 = 25% slack)"
        )
        require(
            0 <= self.grace_min_s <= self.grace_max_s,
            f"exchange.grace_min_s={self.grace_min_s} and grace_max_s={self.grace_max_s}: need 0 <= min <= max",
        )

    @property
    def pause_bound_s(self) -> float:
        """Longest a blocking exchange can hold a peer: quorum wait, grace, then results (≤ 2 · grace),
        and never more than `timeout_s`."""
        return min(self.timeout_s, self.quorum_wait_max_s + 3 * self.grace_max_s)


@dataclass(frozen=True)
class NetworkConfig:
    """Timing of the swarm's control plane: heartbeats, the live view and state downloads."""

    view_period_s: float = 2.0
    """How often a peer publishes its heartbeat and refreshes its view of the live peers."""
    heartbeat_ttl_s: float = 8.0
    """A peer whose heartbeat is this old, and from which nothing arrived for as long, leaves the view."""
    run_definition_ttl_s: float = 600.0
    """Lifetime of the swarm's run definition in the DHT; every joiner re-publishes it."""
    state_download_timeout_s: float = 120.0
    """Longest download of the swarm's state (φ, m, round) from one donor on a late join."""
    resync_download_timeout_s: float = 30.0
    """Longest download from one donor when a peer that fell behind re-syncs mid-run."""
    state_stall_timeout_s: float = 10.0
    """A state download from which no bytes arrive for this long fails; the next donor is tried."""
    late_join_patience_s: float = 30.0
    """How long a late joiner keeps trying donors it can see before it gives up."""

    def __post_init__(self) -> None:
        check_fields(self, "network")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            require(value > 0, f"network.{f.name}={value}: use a positive number of seconds")
        require(
            self.heartbeat_ttl_s > self.view_period_s,
            f"network.heartbeat_ttl_s={self.heartbeat_ttl_s} must exceed network.view_period_s="
            f"{self.view_period_s}: a live peer's heartbeat would expire between two refreshes",
        )
        require(
            self.state_stall_timeout_s <= self.state_download_timeout_s,
            "network.state_stall_timeout_s must not exceed network.state_download_timeout_s",
        )
